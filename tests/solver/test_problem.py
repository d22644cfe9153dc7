"""`ShardingProblem`: validation, cost, usage profile and feasibility."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autopar.errors import ProblemFormatError
from autopar.solver import ShardingProblem


def small(**overrides) -> ShardingProblem:
    fields = dict(node_costs=([1.0, 2.0], [0.0, 5.0, math.inf]),
                  node_usages=([4.0, 1.0], [2.0, 2.0, 0.0]),
                  intervals=((0, 2), (1, 3)),
                  edges=((0, 1), (1, 0)),
                  edge_costs=(np.arange(6.0).reshape(2, 3), np.ones((3, 2))),
                  usage_limit=5.0)
    fields.update(overrides)
    return ShardingProblem(**fields)


def test_cost_adds_nodes_and_parallel_edges() -> None:
    p = small()
    assert p.num_nodes == 2 and p.num_edges == 2
    assert p.cost([0, 0]) == 1 + 0 + 0 + 1
    assert p.cost([1, 1]) == 2 + 5 + 4 + 1
    assert p.cost([0, 2]) == math.inf


def test_profile_peak_and_feasibility() -> None:
    p = small()
    assert list(p.usage_profile([0, 0])) == [4, 6, 2]
    assert p.peak_usage([0, 0]) == 6
    assert not p.is_feasible([0, 0])
    assert p.is_feasible([1, 0])
    assert not p.is_feasible([1, 2])  # forbidden strategy
    assert small(usage_limit=None).is_feasible([0, 0])


def test_ties_are_part_of_feasibility() -> None:
    p = small(node_costs=([1.0, 2.0], [0.0, 5.0]), node_usages=([4.0, 1.0], [2.0, 2.0]),
              edges=(), edge_costs=(), usage_limit=None, ties=((0, 1),))
    assert p.is_feasible([1, 1]) and not p.is_feasible([0, 1])


def test_arrays_are_read_only() -> None:
    p = small()
    with pytest.raises(ValueError):
        p.node_costs[0][0] = 3.0


@pytest.mark.parametrize("overrides", [
    dict(node_usages=([4.0, 1.0],)),
    dict(node_usages=([4.0], [2.0, 2.0, 0.0])),
    dict(intervals=((0, 2), (1,))),
    dict(edges=((0, 2), (1, 0))),
    dict(edges=((0, 0), (1, 0))),
    dict(edge_costs=(np.zeros((3, 3)), np.ones((3, 2)))),
    dict(edge_costs=(np.zeros((2, 3)),)),
    dict(node_costs=([1.0, float("nan")], [0.0, 5.0, 1.0])),
    dict(ties=((0, 1),)),
    dict(ties=((0, 7),)),
    dict(node_costs=("ab", [0.0, 1.0, 2.0])),
])
def test_malformed_problems_raise(overrides) -> None:
    with pytest.raises(ProblemFormatError):
        small(**overrides)


def test_wrong_assignment_raises() -> None:
    with pytest.raises(ProblemFormatError):
        small().cost([0])
    with pytest.raises(ProblemFormatError):
        small().cost([0, 3])
