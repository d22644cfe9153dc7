"""The guided search: memory-priced forest moves, against brute force and against its start."""

from __future__ import annotations

import numpy as np
from solver_cases import brute_force, random_problem
from test_time_use import wide_problem

from autopar.solver.flat import Flat
from autopar.solver.guided import guided_search
from autopar.solver.lagrange import Best, lagrangian
from autopar.solver.progress import Progress
from autopar.solver.reductions import Infeasible, reduce_problem


def test_never_offers_what_does_not_fit_nor_beats_the_optimum() -> None:
    rng = np.random.default_rng(21)
    checked = 0
    for _ in range(60):
        problem = random_problem(rng)
        try:
            flat = Flat.build(reduce_problem(problem))
        except Infeasible:
            continue
        best = Best()
        _, _, prices = lagrangian(flat, best, iterations=3, patience=3, seed=0,
                                  keep_going=lambda: True, report=Progress.silent())
        if best.x is None:
            continue
        start = best.cost
        guided_search(flat, best, prices, iterations=40, patience=40, seed=1,
                      keep_going=lambda: True, report=Progress.silent())
        assert (flat.profile(best.x) <= flat.limit).all()
        assert best.cost == flat.objective(best.x) <= start
        assert best.cost >= brute_force(problem) - 1e-9 * abs(best.cost)
        checked += 1
    assert checked >= 20


def test_improves_a_memory_bound_start() -> None:
    """On a problem whose limit binds everywhere, from the Lagrangian's assignment and
    prices, within a few dozen iterations."""
    flat = Flat.build(reduce_problem(wide_problem(7, n=200, strategies=20)))
    best = Best()
    _, _, prices = lagrangian(flat, best, iterations=5, patience=5, seed=0,
                              keep_going=lambda: True, report=Progress.silent())
    start = best.cost
    ran = guided_search(flat, best, prices, iterations=60, patience=60, seed=0,
                        keep_going=lambda: True, report=Progress.silent())
    assert ran.iterations == 60 and best.cost < start
    assert ran.x is not None and flat.objective(ran.x) == best.cost
    assert (flat.profile(best.x) <= flat.limit).all()
