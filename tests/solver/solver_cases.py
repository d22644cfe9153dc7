"""Random small sharding problems and brute-force answers for the solver tests."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator

import numpy as np

from autopar.solver import ShardingProblem
from autopar.solver.problem import EdgeUsage

# Brute force enumerates at most this many assignments.
MAX_ASSIGNMENTS = 60_000


def random_problem(rng: np.random.Generator, *, limit: str = "random",
                   ties: bool = False) -> ShardingProblem:
    """Up to 12 nodes, up to 4 strategies, parallel edges, forbidden choices, intervals.

    `limit`: "none", "loose", "binding" (between least and unconstrained peak),
    "tight" (possibly below the least peak: infeasible) or "random".
    """
    n = int(rng.integers(1, 13))
    sizes = rng.integers(1, 5, size=n)
    while np.prod(sizes.astype(float)) > MAX_ASSIGNMENTS:
        sizes[int(np.argmax(sizes))] -= 1
    groups: list[tuple[int, ...]] = []
    if ties and n >= 2:
        members = rng.choice(n, size=int(rng.integers(2, min(n, 4) + 1)), replace=False)
        sizes[members] = sizes[members[0]]
        groups.append(tuple(int(i) for i in members))
    costs = [rng.integers(0, 20, size=k).astype(float) for k in sizes]
    for c in costs:
        if c.size > 1 and rng.random() < 0.3:
            c[rng.integers(c.size)] = math.inf
    usages = [rng.integers(0, 10, size=k).astype(float) for k in sizes]
    horizon = int(rng.integers(1, 12))
    intervals = []
    for _ in range(n):
        lo = int(rng.integers(0, horizon))
        intervals.append((lo, int(rng.integers(lo, horizon + 1))))
    edges, matrices = [], []
    for _ in range(int(rng.integers(0, 2 * n + 1)) if n > 1 else 0):
        a, b = (int(v) for v in rng.choice(n, size=2, replace=False))
        m = rng.integers(0, 30, size=(sizes[a], sizes[b])).astype(float)
        m[rng.random(m.shape) < 0.08] = math.inf
        edges.append((a, b))
        matrices.append(m)
        if rng.random() < 0.2:  # a parallel edge, sometimes reversed
            edges.append((b, a))
            matrices.append(rng.integers(0, 10, size=(sizes[b], sizes[a])).astype(float))
    problem = ShardingProblem(tuple(costs), tuple(usages), tuple(intervals), tuple(edges),
                              tuple(matrices), None, tuple(groups), "random")
    kind = limit if limit != "random" else str(rng.choice(["none", "loose", "binding",
                                                           "binding", "binding", "tight"]))
    if kind == "none":
        return problem
    table = enumerate_all(problem)
    finite = np.isfinite(table.costs)
    if not finite.any():
        return _with_limit(problem, 0.0)
    least, top = table.peaks[finite].min(), table.peaks[finite].max()
    cheapest = table.costs == table.costs[finite].min()
    # Just below the least peak of the optimal assignments: the limit changes the answer.
    optimal_peak = table.peaks[cheapest].min()
    binding = float(rng.integers(least, optimal_peak)) if optimal_peak > least else least
    value = {"loose": top, "binding": binding,
             "tight": least - float(rng.integers(0, 2))}[kind]
    return _with_limit(problem, float(value))


def _with_limit(problem: ShardingProblem, limit: float) -> ShardingProblem:
    return ShardingProblem(problem.node_costs, problem.node_usages, problem.intervals,
                           problem.edges, problem.edge_costs, limit, problem.ties,
                           problem.name)


class Table:
    """Every assignment of a small problem with its cost and peak usage."""

    def __init__(self, choices: np.ndarray, costs: np.ndarray, peaks: np.ndarray):
        self.choices, self.costs, self.peaks = choices, costs, peaks


def enumerate_all(problem: ShardingProblem) -> Table:
    """Cost and peak of all assignments (ties enforced: others get cost inf)."""
    sizes = [c.size for c in problem.node_costs]
    choices = np.array(list(itertools.product(*[range(k) for k in sizes])), dtype=np.int64)
    choices = choices.reshape(-1, len(sizes))
    costs = np.zeros(len(choices))
    for i, c in enumerate(problem.node_costs):
        costs += c[choices[:, i]]
    for (a, b), m in zip(problem.edges, problem.edge_costs):
        costs += m[choices[:, a], choices[:, b]]
    for group in problem.ties:
        for j in group[1:]:
            costs[choices[:, j] != choices[:, group[0]]] = math.inf
    horizon = max([hi for lo, hi in problem.intervals if lo < hi], default=0)
    profile = np.zeros((len(choices), max(horizon, 1)))
    for i, ((lo, hi), u) in enumerate(zip(problem.intervals, problem.node_usages)):
        if lo < hi:
            profile[:, lo:hi] += u[choices[:, i]][:, None]
    return Table(choices, costs, profile.max(axis=1))


def brute_force(problem: ShardingProblem) -> float:
    """Optimal cost (inf when nothing is feasible)."""
    table = enumerate_all(problem)
    ok = np.isfinite(table.costs)
    if problem.usage_limit is not None:
        ok &= table.peaks <= problem.usage_limit
    return float(table.costs[ok].min()) if ok.any() else math.inf


def brute_min_peak(problem: ShardingProblem) -> float:
    """Least peak usage over finite-cost assignments (inf when there is none)."""
    table = enumerate_all(problem)
    ok = np.isfinite(table.costs)
    return float(table.peaks[ok].min()) if ok.any() else math.inf


def halfway_limited(rng: np.random.Generator, count: int
                    ) -> Iterator[tuple[ShardingProblem, Table, tuple[int, ...]]]:
    """Of `count` random problems with ties and one to three edge usages, those whose
    cheapest assignment peaks above the least peak of any (of their node usages, a lower
    bound): each with its limit halfway between the two, its enumerated assignments
    (`enumerate_all`) and that cheapest assignment."""
    for _ in range(count):
        base = random_problem(rng, limit="none", ties=True)
        if base.num_nodes < 2:
            continue
        usages = []
        for _ in range(int(rng.integers(1, 4))):
            a, b = (int(v) for v in rng.choice(base.num_nodes, size=2, replace=False))
            lo = int(rng.integers(0, 6))
            matrix = rng.integers(0, 12, size=(base.node_costs[a].size,
                                              base.node_costs[b].size)).astype(float)
            usages.append(EdgeUsage((a, b), matrix, (lo, lo + int(rng.integers(1, 6)))))
        problem = dataclasses.replace(base, edge_usages=tuple(usages))
        table = enumerate_all(problem)
        finite = np.isfinite(table.costs)
        if not finite.any():
            continue
        cheapest = tuple(int(k) for k in
                         table.choices[int(np.argmin(np.where(finite, table.costs, math.inf)))])
        least, peak = table.peaks[finite].min(), problem.peak_usage(cheapest)
        if peak > least:
            limit = float(least + (peak - least) / 2)
            yield dataclasses.replace(problem, usage_limit=limit), table, cheapest
