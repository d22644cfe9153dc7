"""How a solve spends its time limit, and what `--progress` shows of it."""

from __future__ import annotations

import re

import numpy as np

from autopar.solver import ShardingProblem, solve
from autopar.solver.budget import EXACT_CELLS


def wide_problem(seed: int, n: int = 300, strategies: int = 40) -> ShardingProblem:
    """A memory-bound chain with shortcuts whose whole CP-SAT model is too big to build
    (more than EXACT_CELLS booleans), so no phase can prove its answer optimal."""
    rng = np.random.default_rng(seed)
    costs = tuple(rng.integers(0, 1000, size=strategies).astype(float) for _ in range(n))
    usages = tuple(rng.integers(1, 50, size=strategies).astype(float) for _ in range(n))
    intervals = tuple((i, i + int(rng.integers(1, 20))) for i in range(n))
    edges = [(i, i + 1) for i in range(n - 1)] + [(i, i + 7) for i in range(0, n - 7, 5)]
    mats = tuple(rng.integers(0, 2000, size=(strategies, strategies)).astype(float)
                 for _ in edges)
    return ShardingProblem(costs, usages, intervals, tuple(edges), mats, 100.0)


def test_an_open_gap_keeps_the_search_going_until_the_limit() -> None:
    problem = wide_problem(3)
    assert len(problem.edges) * 40**2 > EXACT_CELLS
    lines: list[str] = []
    solution = solve(problem, time_limit=4.0, progress=lines.append)
    assert solution.status == "feasible" and problem.is_feasible(solution.choices)
    assert 3.0 <= solution.wall_time <= 4.5
    # Each line carries the clock, the objective, the bound and the gap, in that order.
    pattern = re.compile(r"^\s*(\d+\.\d) s  objective (\S+)  bound (\S+)  gap (\S+)  \S")
    parsed = [pattern.match(line) for line in lines]
    assert all(parsed), [line for line, m in zip(lines, parsed) if not m]
    clocks = [float(m.group(1)) for m in parsed]
    objectives = [float(m.group(2)) for m in parsed]
    assert clocks == sorted(clocks) and clocks[-1] >= 3.0
    finite = [o for o in objectives if np.isfinite(o)]
    assert finite == sorted(finite, reverse=True) and finite[-1] == solution.cost
    # Quiet stretches of search still report (at most every 5 s): no gap longer than that
    # plus one LNS round.
    assert max(np.diff([0.0, *clocks]), default=0.0) < 7.0


def test_a_proven_optimum_ends_the_solve_early() -> None:
    problem = wide_problem(5, n=12, strategies=3)
    solution = solve(problem, time_limit=20.0)
    assert solution.status == "optimal" and solution.wall_time < 5.0
