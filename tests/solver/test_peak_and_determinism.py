"""`min_peak_usage` against brute force, and repeatable solves."""

from __future__ import annotations

import math

import numpy as np
from solver_cases import brute_min_peak, random_problem

from autopar.solver import ShardingProblem, min_peak_usage, solve
from autopar.solver.flat import Flat
from autopar.solver.lagrange import Best, lagrangian
from autopar.solver.lns import large_neighbourhoods
from autopar.solver.progress import Progress
from autopar.solver.reductions import reduce_problem


def test_min_peak_usage_matches_brute_force() -> None:
    rng = np.random.default_rng(11)
    for _ in range(25):
        problem = random_problem(rng, limit="none", ties=bool(rng.random() < 0.3))
        assert min_peak_usage(problem, time_limit=5.0) == brute_min_peak(problem)


def test_min_peak_usage_without_any_finite_assignment() -> None:
    problem = ShardingProblem(([math.inf],), ([1.0],), ((0, 1),), (), ())
    assert min_peak_usage(problem) == math.inf


def medium_problem(seed: int, n: int = 60) -> ShardingProblem:
    """A chain-with-shortcuts graph whose memory limit binds."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 7, size=n)
    costs = tuple(rng.integers(0, 100, size=k).astype(float) for k in sizes)
    usages = tuple(rng.integers(1, 50, size=k).astype(float) for k in sizes)
    intervals = tuple((i, i + int(rng.integers(1, 15))) for i in range(n))
    edges = [(i, i + 1) for i in range(n - 1)]
    edges += [(i, int(j)) for i in range(n) for j in rng.choice(n, 1) if j > i + 1]
    mats = tuple(rng.integers(0, 200, size=(sizes[a], sizes[b])).astype(float)
                 for a, b in edges)
    free = ShardingProblem(costs, usages, intervals, tuple(edges), mats, None)
    peak = free.peak_usage(solve(free, time_limit=2.0).choices)
    return ShardingProblem(costs, usages, intervals, tuple(edges), mats, 0.8 * peak)


def test_solve_is_deterministic() -> None:
    problem = medium_problem(5)
    first = solve(problem, time_limit=3.0, repeatable=True)
    second = solve(problem, time_limit=3.0, repeatable=True)
    assert first.choices and first.choices == second.choices
    assert first.cost == second.cost and problem.is_feasible(first.choices)


def test_lagrangian_and_lns_are_deterministic() -> None:
    flat = Flat.build(reduce_problem(medium_problem(9, n=80)))
    runs = []
    for _ in range(2):
        best = Best()
        lagrangian(flat, best, iterations=15, patience=100, seed=3,
                   keep_going=lambda: True, report=Progress.silent())
        large_neighbourhoods(flat, best, deterministic=0.6, seed=3,
                             keep_going=lambda: True, wall=lambda: 30.0,
                             report=Progress.silent())
        runs.append((best.cost, tuple(best.x)))
    assert runs[0] == runs[1] and math.isfinite(runs[0][0])
