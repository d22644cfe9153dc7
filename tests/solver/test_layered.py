"""Problems shaped like our torch graphs: repeated tied blocks, many strategies, memory."""

from __future__ import annotations

import numpy as np

from autopar.solver import ShardingProblem, solve


def layered_problem(blocks: int = 6, width: int = 4, strategies: int = 24,
                    seed: int = 0, squeeze: float = 0.9) -> ShardingProblem:
    """`blocks` identical blocks of `width` ops in a chain with residual edges; the ops
    of every block are tied to the first block's. Resharding is free between equal
    strategies. The memory limit is `squeeze` times the peak of the cheapest plan."""
    rng = np.random.default_rng(seed)
    n = blocks * width + 2
    compute = rng.uniform(1e-4, 1e-3, size=(width, strategies))
    memory = rng.integers(1, 64, size=(width, strategies)).astype(float) * 2**20
    reshard = rng.uniform(1e-5, 5e-4, size=(strategies, strategies))
    np.fill_diagonal(reshard, 0.0)
    costs = [rng.uniform(1e-4, 1e-3, size=strategies)]
    usages = [rng.integers(1, 64, size=strategies).astype(float) * 2**20]
    for _ in range(blocks):
        costs += [compute[j].copy() for j in range(width)]
        usages += [memory[j].copy() for j in range(width)]
    costs.append(rng.uniform(1e-4, 1e-3, size=strategies))
    usages.append(rng.integers(1, 64, size=strategies).astype(float) * 2**20)
    intervals = [(0, n + 1)] + [(i, n - i // 2) for i in range(1, n - 1)] + [(n - 1, n + 1)]
    edges, mats = [], []
    for i in range(n - 1):
        edges.append((i, i + 1))
        mats.append(reshard.copy())
    for b in range(blocks):  # residual connection around each block
        edges.append((b * width, (b + 1) * width))
        mats.append(reshard.copy())
    ties = tuple(tuple(1 + b * width + j for b in range(blocks)) for j in range(width))
    free = ShardingProblem(tuple(costs), tuple(usages), tuple(intervals), tuple(edges),
                           tuple(mats), None, ties)
    peak = free.peak_usage(solve(free, time_limit=10.0).choices)
    return ShardingProblem(tuple(costs), tuple(usages), tuple(intervals), tuple(edges),
                           tuple(mats), squeeze * peak, ties, "layered")


def test_layered_problem_is_solved_to_optimality() -> None:
    problem = layered_problem()
    solution = solve(problem, time_limit=30.0)
    assert solution.status == "optimal", solution.status
    assert problem.is_feasible(solution.choices)
    assert solution.gap == 0.0
    for group in problem.ties:
        assert len({solution.choices[i] for i in group}) == 1


def test_more_memory_never_costs_more() -> None:
    tight = layered_problem(seed=1, squeeze=0.8)
    loose = layered_problem(seed=1, squeeze=1.0)
    a, b = solve(tight, time_limit=30.0), solve(loose, time_limit=30.0)
    assert a.status == b.status == "optimal"
    assert b.cost <= a.cost + 1e-12
