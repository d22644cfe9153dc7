"""Penalty search: per-term price brackets, toulbar2's priced answers, forked children."""

from __future__ import annotations

import itertools
import os
import time

import numpy as np
from solver_cases import random_problem
from test_time_use import wide_problem

from autopar.solver.flat import Flat
from autopar.solver.lagrange import Best, lagrangian
from autopar.solver.penalties import (
    LEVELS,
    Brackets,
    broken_terms,
    in_children,
    ladder,
    penalty_search,
)
from autopar.solver.progress import Progress
from autopar.solver.reductions import Infeasible, reduce_problem
from autopar.solver.solve import solve
from autopar.solver.wcsp import Wcsp


def test_a_term_s_bracket_closes_on_the_levels_where_it_crosses_the_limit():
    prices = np.array([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [3.0, 3.0, 3.0], [4.0, 4.0, 4.0]])
    broken = np.array([[True, False, True],
                       [True, False, True],
                       [False, False, True],
                       [True, False, True]])  # term 0 overflows again above: kept [2, 3]
    narrowed = Brackets(np.full(3, 0.6), np.full(3, 4.0)).narrowed(prices, broken)
    # Term 0: over at 2, within at 3. Term 1: within everywhere, the bracket's lower end
    # shrinks and its upper end is the lowest level. Term 2: over everywhere, it grows.
    assert np.allclose(narrowed.lo, [2.0, 0.4, 4.0])
    assert np.allclose(narrowed.hi, [3.0, 1.0, 4.0 * 1.35])
    levels = narrowed.levels()
    assert levels.shape == (LEVELS, 3)
    assert np.allclose(levels[-1], narrowed.hi) and (np.diff(levels, axis=0) >= 0).all()
    assert (levels[0] > narrowed.lo).all() or np.allclose(narrowed.lo, narrowed.hi)


def test_the_first_ladder_prices_every_term_alike_around_the_cost_per_byte():
    flat = Flat.build(reduce_problem(wide_problem(0, n=60, strategies=6)))
    x = np.zeros(flat.num_nodes, dtype=np.int64)
    prices = ladder(flat, x)
    per_byte = flat.objective(x) / flat.term_values(x).sum()
    assert prices.shape == (LEVELS, flat.term_node.size)
    assert np.allclose(prices[1], per_byte) and np.allclose(prices[2], 4 * per_byte)
    assert (prices == prices[:, :1]).all()


def test_broken_terms_are_those_with_a_segment_over_the_limit():
    rng = np.random.default_rng(5)
    for seed in range(4):
        flat = Flat.build(reduce_problem(wide_problem(seed, n=200, strategies=20)))
        x = rng.integers(0, flat.sizes)
        over = flat.profile(x) > flat.limit
        expected = [over[lo:hi].any() for lo, hi in zip(flat.term_lo, flat.term_hi)]
        assert broken_terms(flat, x).tolist() == expected


def _priced(flat: Flat, costs: np.ndarray, x: np.ndarray) -> float:
    """The objective of `x` with `costs` for the nodes' own."""
    cells = flat.offsets[:-1] + x
    return flat.objective(x) - flat.cost_flat[cells].sum() + costs[cells].sum()


def _priced_optimum(flat: Flat, costs: np.ndarray) -> float:
    return min(_priced(flat, costs, np.asarray(choice, dtype=np.int64))
               for choice in itertools.product(*(range(int(k)) for k in flat.sizes)))


def test_toulbar2_answers_small_priced_problems_optimally():
    """Priced by random per-term prices, problems small enough to enumerate: toulbar2's
    answer costs what the enumeration's optimum costs (it proves them in well under its
    second)."""
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(120):
        try:
            flat = Flat.build(reduce_problem(random_problem(rng, limit="binding")))
        except Infeasible:
            continue
        if flat.num_nodes < 2 or np.prod(flat.sizes.astype(float)) > 3000:
            continue
        costs = flat.priced_terms(rng.uniform(0, 3, flat.term_node.size))
        x = Wcsp(flat).answer(costs, seconds=1, seed=0)
        optimum = _priced_optimum(flat, costs)
        if not np.isfinite(optimum):
            assert x is None
            continue
        got = _priced(flat, costs, x)
        # toulbar2 rounds each cost to an integer: within half a unit per table.
        assert abs(got - optimum) <= 0.5 * (flat.num_nodes + len(flat.edge_a)) + 1e-6
        checked += 1
    assert checked >= 25


def _fail() -> int:
    raise RuntimeError("a child's failure is its result None")


def test_children_return_each_result_with_its_index_and_none_for_a_failure():
    tasks = [lambda k=k: (os.getpid(), k * k) for k in range(5)] + [_fail]
    results = dict(in_children(tasks, workers=2, seconds=lambda: 30.0))
    assert sorted(results) == list(range(6)) and results[5] is None
    assert [results[k][1] for k in range(5)] == [0, 1, 4, 9, 16]
    assert os.getpid() not in {results[k][0] for k in range(5)}  # forked, not in process


def test_children_still_running_at_the_deadline_are_stopped():
    deadline = time.monotonic() + 1.0
    start = time.monotonic()
    results = list(in_children([lambda: time.sleep(30), lambda: 7], workers=2,
                               seconds=lambda: deadline - time.monotonic()))
    assert results == [(1, 7)] and time.monotonic() - start < 5


def test_the_penalty_search_fits_and_never_leaves_the_incumbent_dearer():
    for seed in range(3):
        flat = Flat.build(reduce_problem(wide_problem(seed, n=200, strategies=20)))
        best = Best()
        lagrangian(flat, best, iterations=5, patience=5, seed=seed, keep_going=lambda: True,
                   report=Progress.silent())
        start = best.cost
        deadline = time.monotonic() + 6.0
        penalty_search(flat, best, workers=2, seed=seed, keep_going=lambda: True,
                       wall=lambda end=deadline: end - time.monotonic(),
                       report=Progress.silent())
        assert (flat.profile(best.x) <= flat.limit).all() and best.cost <= start
        assert time.monotonic() <= deadline + 1.0


def test_a_solve_with_the_penalty_search_beats_its_lagrangian_start():
    """On memory-bound problems too large for an exact model, `solve`'s time after the
    Lagrangian goes to the penalty search: the answer fits, and on every seed it is
    cheaper than the Lagrangian's alone."""
    for seed in range(3):
        problem = wide_problem(seed)
        flat = Flat.build(reduce_problem(problem))
        start = Best()
        lagrangian(flat, start, iterations=10, patience=10, seed=seed,
                   keep_going=lambda: True, report=Progress.silent())
        lines: list[str] = []
        solution = solve(problem, time_limit=8.0, seed=seed, progress=lines.append)
        assert problem.is_feasible(solution.choices)
        assert solution.cost < start.cost
        assert any("penalty round" in line for line in lines)
