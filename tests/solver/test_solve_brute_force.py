"""`solve` against brute-force enumeration on random small problems."""

from __future__ import annotations

import math

import numpy as np
import pytest
from solver_cases import brute_force, random_problem

from autopar.solver import solve
from autopar.solver.exact import solve_whole
from autopar.solver.flat import Flat
from autopar.solver.lagrange import Best
from autopar.solver.progress import Progress
from autopar.solver.reductions import Infeasible, reduce_problem

CASES = 240


def _check(problem, expected: float) -> None:
    solution = solve(problem, time_limit=20.0)
    if math.isinf(expected):
        assert solution.status == "infeasible", solution
        assert solution.choices == ()
        return
    assert solution.status == "optimal", solution
    assert problem.is_feasible(solution.choices)
    assert solution.cost == pytest.approx(expected, abs=1e-9)
    assert problem.cost(solution.choices) == solution.cost
    assert solution.bound == solution.cost and solution.gap == 0.0


@pytest.mark.parametrize("block", range(8))
def test_random_problems_match_brute_force(block: int) -> None:
    rng = np.random.default_rng(1000 + block)
    for _ in range(CASES // 8):
        problem = random_problem(rng, ties=bool(rng.random() < 0.3))
        _check(problem, brute_force(problem))


def test_kinds_are_all_exercised() -> None:
    """Binding limits, infeasible limits and ties all occur among the random cases."""
    rng = np.random.default_rng(7)
    seen = set()
    for kind in ("binding", "tight", "none"):
        for _ in range(10):
            problem = random_problem(rng, limit=kind, ties=True)
            expected = brute_force(problem)
            seen.add((kind, math.isinf(expected)))
            _check(problem, expected)
    assert ("tight", True) in seen and ("binding", False) in seen


def test_cp_sat_on_the_reduced_problem_matches_brute_force() -> None:
    """The whole-problem CP-SAT phase on its own (no enumeration, no hint, no LP)."""
    rng = np.random.default_rng(77)
    checked = 0
    while checked < 25:
        problem = random_problem(rng, ties=bool(rng.random() < 0.3))
        expected = brute_force(problem)
        try:
            flat = Flat.build(reduce_problem(problem))
        except Infeasible:
            assert math.isinf(expected)
            continue
        if flat.num_nodes < 2:
            continue
        best = Best()
        outcome = solve_whole(flat, best, np.zeros(flat.problem.base.size, dtype=bool),
                              deterministic=10.0, wall=lambda: 10.0, seed=0, workers=2,
                              report=Progress.silent())
        if math.isinf(expected):
            assert outcome.status == "infeasible" and best.x is None
        else:
            assert outcome.status == "optimal" and best.cost == expected
        checked += 1
