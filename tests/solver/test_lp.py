"""The linear model for HiGHS (`lp.py`) against brute-force enumeration."""

from __future__ import annotations

import math
import time

import numpy as np
from solver_cases import brute_force, random_problem

from autopar.solver.flat import Flat
from autopar.solver.lagrange import Best, lagrangian
from autopar.solver.lp import LinearModel
from autopar.solver.progress import Progress
from autopar.solver.reductions import Infeasible, reduce_problem


def _cases(seed: int, count: int):
    """(flat, a feasible assignment, the optimum) of random problems with binding limits
    whose reduction leaves at least two nodes."""
    rng = np.random.default_rng(seed)
    found = 0
    while found < count:
        problem = random_problem(rng, limit="binding", ties=bool(rng.random() < 0.3))
        expected = brute_force(problem)
        try:
            flat = Flat.build(reduce_problem(problem))
        except Infeasible:
            continue
        if flat.num_nodes < 2 or math.isinf(expected):
            continue
        best = Best()
        lagrangian(flat, best, iterations=3, patience=3, seed=0, keep_going=lambda: False,
                   report=Progress(None, best, started=time.monotonic()))
        if best.x is None:
            continue
        found += 1
        yield flat, best, expected


def test_relaxation_bounds_and_branch_and_bound_reaches_the_optimum() -> None:
    segments_of = lambda flat: np.arange(flat.problem.base.size)  # noqa: E731
    closed_below = 0
    for flat, best, expected in _cases(seed=31, count=30):
        model = LinearModel(flat, segments_of(flat))
        relaxed = model.relax(10.0)
        assert relaxed.bound <= expected + 1e-9 * abs(expected)
        branched = model.branch(best.x, 1e-9, 10.0)
        assert branched.closed
        assert branched.bound <= expected + 1e-9 * abs(expected)
        if branched.x is None:  # the incumbent was already optimal
            assert best.cost == expected
        else:
            assert (flat.profile(branched.x) <= flat.limit).all()
            assert flat.objective(branched.x) == expected
            assert flat.objective(branched.x) <= best.cost
        closed_below += relaxed.bound < expected - 1e-9 * abs(expected)
    # Some cases must have a relaxation gap, or branching was never needed.
    assert closed_below > 0


def test_memory_rows_on_some_segments_relax_the_problem() -> None:
    """Without memory rows the relaxation is the unconstrained one: never above the
    constrained bound."""
    for flat, _, expected in _cases(seed=5, count=10):
        none = LinearModel(flat, np.zeros(0, dtype=np.int64)).relax(10.0).bound
        every = LinearModel(flat, np.arange(flat.problem.base.size)).relax(10.0).bound
        assert none <= every + 1e-9 * max(abs(every), 1.0) <= expected + 1e-9 * abs(expected) + 1e-9


def test_memory_rows_hold_every_live_usage_of_their_segments() -> None:
    """Row q of the memory rows is segment q's usage, as `Flat.profile` sums it: for random
    assignments, the row times the assignment's strategy columns plus the base equals the
    profile there (segments unsorted and repeated, as callers may pass them)."""
    rng = np.random.default_rng(3)
    for flat, best, _ in _cases(seed=7, count=10):
        segments = rng.permutation(flat.problem.base.size)
        segments = np.concatenate([segments, segments[:2]])
        model = LinearModel(flat, segments)
        lp = model._lp
        first = lp.num_row_ - segments.size  # the memory rows come last
        matrix = np.zeros((lp.num_row_, lp.num_col_))
        starts = np.asarray(lp.a_matrix_.start_)
        index, value = np.asarray(lp.a_matrix_.index_), np.asarray(lp.a_matrix_.value_)
        for column in range(lp.num_col_):
            span = slice(starts[column], starts[column + 1])
            matrix[index[span], column] = value[span]
        for x in [best.x] + [np.array([rng.integers(s) for s in flat.sizes]) for _ in range(5)]:
            if not np.isfinite(flat.cost_flat[flat.offsets[:-1] + x]).all():
                continue
            columns = model.column[flat.offsets[:-1] + x]
            used = matrix[first:first + segments.size][:, columns].sum(axis=1)
            expected = flat.profile(x)[segments] - flat.problem.base[segments]
            np.testing.assert_allclose(used, expected, rtol=1e-12, atol=1e-9)


def test_a_relaxation_stopped_by_its_iterations_proves_nothing_and_says_how_many() -> None:
    """The iteration limit is what keeps a planner's solve repeatable: a run cut short by
    it has no bound, and counts the iterations it ran, the same on every run."""
    cut_short = 0
    for flat, _, expected in _cases(seed=11, count=5):
        model = LinearModel(flat, np.arange(flat.problem.base.size))
        whole = model.relax(10.0)
        assert whole.bound <= expected + 1e-9 * abs(expected) and whole.iterations >= 1
        if whole.iterations > 1:
            cut = model.relax(10.0, iterations=1)
            assert cut.bound == -math.inf and cut.iterations == 1
            cut_short += 1
    assert cut_short > 0
