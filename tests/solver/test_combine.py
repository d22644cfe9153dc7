"""Two problems as one (`autopar.solver.combine`): shared decisions chosen once, costs
weighed, each problem's memory on its own timeline."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from autopar.solver import ShardingProblem, solve
from autopar.solver.combine import combined, horizon, split

SAME = np.eye(2, dtype=bool)


def _program(state_costs: list[float], *, usage: float = 0.0) -> ShardingProblem:
    """A shared state (node 0: two placements) and an op reading it (node 1), whose edge
    costs 2 when the op's strategy differs from the state's; each holds `usage` while it
    runs."""
    return ShardingProblem(node_costs=(state_costs, [0.5, 0.5]),
                           node_usages=([usage, usage], [usage, 0.0]),
                           intervals=((0, 2), (0, 1)), edges=((0, 1),),
                           edge_costs=(np.array([[0.0, 2.0], [2.0, 0.0]]),),
                           usage_limit=10.0)


def _best(first: ShardingProblem, second: ShardingProblem, weights: tuple[float, float]
          ) -> float:
    """Brute force: the least weighted cost with the state placed alike in both."""
    best = math.inf
    for x in itertools.product(range(2), repeat=4):
        if x[0] != x[2]:
            continue
        a, b = (first.cost(x[:2]), second.cost(x[2:]))
        if first.is_feasible(x[:2]) and second.is_feasible(x[2:]):
            best = min(best, weights[0] * a + weights[1] * b)
    return best


@pytest.mark.parametrize("weights, placement", [((1.0, 1.0), 1), ((5.0, 1.0), 0)])
def test_the_shared_state_is_chosen_once_for_the_weighed_sum(weights, placement):
    # Alone, the first program places its state at 0 and the second at 1.
    first, second = _program([0.0, 1.0]), _program([3.0, 0.0])
    problem = combined(first, second, weights=weights, shared=[(0, 0, SAME)])
    solution = solve(problem, time_limit=5.0)
    assert solution.status == "optimal" and solution.choices[0] == solution.choices[2]
    assert solution.choices[0] == placement
    assert solution.cost == pytest.approx(_best(first, second, weights))
    one, two = split(solution, first, second)
    assert (one.choices, two.choices) == (solution.choices[:2], solution.choices[2:])
    assert weights[0] * one.cost + weights[1] * two.cost == pytest.approx(solution.cost)


def test_each_program_s_memory_is_on_its_own_timeline():
    first, second = _program([0.0, 0.0], usage=6.0), _program([0.0, 0.0], usage=6.0)
    problem = combined(first, second, shared=[(0, 0, SAME)])
    # 6 + 6 would break the limit of 10 if both ran at once; one after the other, each fits.
    assert problem.intervals[2:] == ((2, 4), (2, 3)) and horizon(problem) == 4
    solution = solve(problem, time_limit=5.0)
    assert solution.choices and problem.peak_usage(solution.choices) == 12.0 / 2


def test_pairs_placed_differently_are_forbidden():
    first, second = _program([0.0, 5.0]), _program([5.0, 0.0])
    free = solve(combined(first, second), time_limit=5.0)
    tied = solve(combined(first, second, shared=[(0, 0, SAME)]), time_limit=5.0)
    assert free.choices[0] != free.choices[2] and free.cost == pytest.approx(1.0)
    assert tied.choices[0] == tied.choices[2] and tied.cost == pytest.approx(6.0)


def test_a_program_weighed_zero_costs_nothing_but_keeps_what_it_forbids():
    first = ShardingProblem(node_costs=([math.inf, 5.0],), node_usages=([0.0, 0.0],),
                            intervals=((0, 1),), edges=(), edge_costs=())
    problem = combined(first, _program([0.0, 1.0]), weights=(0.0, 1.0), shared=[(0, 0, SAME)])
    solution = solve(problem, time_limit=5.0)
    # The first program's placement 0 stays forbidden; its cost of 5 counts for nothing.
    assert solution.choices[0] == solution.choices[1] == 1
    assert solution.cost == pytest.approx(1.5)
