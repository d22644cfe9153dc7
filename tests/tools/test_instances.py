"""Generated instances: the same per seed, well formed, with the statistics the generator's
docstring claims, a usage limit that binds, and a file that loads back unchanged."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from autopar.errors import ProblemFormatError
from autopar.solver import ShardingProblem, load_iopddl, min_peak_usage, solve
from autopar.solver.iopddl import write_iopddl
from autopar.tools.instances import (
    LARGEST,
    SMALLEST,
    Traits,
    family,
    family_members,
    generate,
    lean_choices,
    reshard_costs,
    valid_specs,
)

# The members of family(20, 0) up to 2,460 nodes: built in about 3 s together.
SMALL_MEMBERS = family_members(20, 0)[:10]
# Ranges the module docstring claims for family(20, 0), by statistic.
CLAIMED = {"edges_per_node": (1.13, 1.61), "strategies_mean": (5.2, 9.3),
           "strategies_max": (23, 759), "single_share": (0.02, 0.39), "few_share": (0.25, 0.63),
           "short_share": (0.14, 0.53), "follow_share": (0.23, 0.58),
           "never_live_share": (0.06, 0.18)}


@dataclasses.dataclass(frozen=True)
class Stats:
    edges_per_node: float
    strategies_mean: float
    strategies_max: int
    single_share: float      # nodes of one strategy
    few_share: float         # nodes of at most 4
    short_share: float       # edges (a, b) with b - a <= 8
    follow_share: float      # edges of an identity matrix, forbidden elsewhere
    never_live_share: float  # nodes of an empty interval


def is_follow(matrix: np.ndarray) -> bool:
    off = ~np.eye(matrix.shape[0], dtype=bool)
    return (matrix.shape[0] == matrix.shape[1] > 1 and not np.diag(matrix).any()
            and bool(np.isinf(matrix[off]).all()))


def measure(problem: ShardingProblem) -> Stats:
    counts = np.array([c.size for c in problem.node_costs])
    spans = np.array([b - a for a, b in problem.edges])
    return Stats(problem.num_edges / problem.num_nodes, float(counts.mean()),
                 int(counts.max()), float(np.mean(counts == 1)), float(np.mean(counts <= 4)),
                 float(np.mean(spans <= 8)),
                 float(np.mean([is_follow(m) for m in problem.edge_costs])),
                 float(np.mean([lo >= hi for lo, hi in problem.intervals])))


def same(p: ShardingProblem, q: ShardingProblem) -> bool:
    arrays = [(p.node_costs, q.node_costs), (p.node_usages, q.node_usages),
              (p.edge_costs, q.edge_costs)]
    return (p.intervals == q.intervals and p.edges == q.edges and p.name == q.name
            and p.usage_limit == q.usage_limit
            and all(len(x) == len(y) and all(np.array_equal(a, b) for a, b in zip(x, y))
                    for x, y in arrays))


def test_the_same_per_seed_and_different_across_seeds() -> None:
    assert same(generate(3, 300), generate(3, 300))
    other = generate(4, 300)
    assert not same(generate(3, 300), dataclasses.replace(other, name="generated-3-300"))
    assert not same(generate(3, 300, Traits(mesh=(4, 8))), generate(3, 300))


@pytest.mark.parametrize("member", SMALL_MEMBERS[:4], ids=lambda m: m.name)
def test_well_formed(member) -> None:
    problem = member.build()
    assert problem.num_nodes == member.nodes and problem.name == member.name
    assert all(a < b for a, b in problem.edges)
    steps = max(hi for _, hi in problem.intervals)
    assert all(0 <= lo < hi <= steps or lo == hi == 0 for lo, hi in problem.intervals)
    # Exact integers below 2^53, as in the contest's files.
    for values in (*problem.node_costs, *problem.node_usages, *problem.edge_costs):
        finite = values[np.isfinite(values)]
        assert np.array_equal(finite, np.round(finite)) and (finite >= 0).all()
        assert (finite < 2.0**53 / (problem.num_nodes + problem.num_edges)).all()
    lean = lean_choices(problem)
    assert problem.is_feasible(lean)


def test_statistics_in_the_claimed_ranges() -> None:
    stats = [measure(m.build()) for m in SMALL_MEMBERS]
    for name, (lo, hi) in CLAIMED.items():
        values = [getattr(s, name) for s in stats]
        assert lo <= min(values) and max(values) <= hi, (name, values)
    # Strategy counts are skewed like the contest's: many nodes have few, some hundreds.
    assert max(s.strategies_max for s in stats) >= 100


def test_least_peak_exact_and_limit_binds() -> None:
    problem = generate(1, 300)
    least = problem.peak_usage(lean_choices(problem))
    assert problem.usage_limit == math.floor(1.1 * least)
    assert min_peak_usage(problem, time_limit=5.0) == least
    best_fit = solve(problem, time_limit=5.0, repeatable=True)
    assert best_fit.status == "optimal" and problem.is_feasible(best_fit.choices)
    # The optimum spends memory up to the limit: well above the least possible peak.
    assert problem.peak_usage(best_fit.choices) >= 0.93 * problem.usage_limit
    free = solve(dataclasses.replace(problem, usage_limit=None), time_limit=5.0,
                 repeatable=True)
    assert free.status == "optimal" and free.cost < best_fit.cost
    assert problem.peak_usage(free.choices) > 2 * problem.usage_limit


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_write_load_round_trip(tmp_path: Path, suffix: str) -> None:
    problem = generate(5, 400, Traits(big=0.02, forbidden=0.2), name="round-trip")
    assert any(np.isinf(c).any() for c in problem.node_costs)
    assert any(np.isinf(m).any() for m in problem.edge_costs)
    loaded = load_iopddl(write_iopddl(problem, tmp_path / f"p{suffix}"))
    assert same(loaded, problem)


def test_write_refuses_what_the_format_cannot_hold(tmp_path: Path) -> None:
    tied = dataclasses.replace(generate(0, 50), ties=((0, 0),))
    with pytest.raises(ProblemFormatError, match="neither ties nor edge usages"):
        write_iopddl(tied, tmp_path / "t.json")
    with pytest.raises(ProblemFormatError, match="at least 2 nodes"):
        generate(0, 1)


def test_reshard_costs() -> None:
    specs = valid_specs((64, 6), (2, 16))
    # Dim 1 (6) splits over the axis of 2 only; the replicated spec comes last.
    assert specs.tolist() == [[-1, 0], [0, -1], [0, 0], [1, -1], [1, 0], [-1, -1]]
    costs = reshard_costs(specs, specs, 2 * 64 * 6, (2, 16))
    assert not np.diag(costs).any() and not costs[-1].any()
    # All-gather of [0, -1] (split over the axis of 2, weight 4): 4 (1 - 1/2) 768 / 1.
    assert costs[1, -1] == 4 * 0.5 * 768 and (costs[:-1, -1] > 0).all()


def test_family_sizes_and_timeouts() -> None:
    members = family_members(20, 0)
    sizes = [m.nodes for m in members]
    assert sizes[0] == SMALLEST and sizes[-1] == LARGEST and sizes == sorted(set(sizes))
    assert len({m.name for m in members}) == 20 and members == family_members(20, 0)
    timeouts = [m.timeout for m in members]
    assert timeouts == sorted(timeouts) and 10 <= timeouts[0] <= 20
    assert all(60 <= m.timeout <= 300 for m in members if m.nodes >= 10_000)
    halved = family_members(20, 0, scale_timeout=0.5)
    assert [m.timeout for m in halved] == [t / 2 for t in timeouts]
    assert len({m.traits for m in members}) == 20 and len({m.seed for m in members}) == 20
    # A family of one is the first member of any larger one (the same draws), built.
    [(name, problem, timeout)] = family(1, 0)
    assert (name, timeout) == (members[0].name, members[0].timeout)
    assert same(problem, members[0].build())
