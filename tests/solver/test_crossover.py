"""Crossover: an assignment that fits, improved by whole pieces of another one."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
from solver_cases import random_problem
from test_time_use import wide_problem

from autopar.solver.crossover import crossed
from autopar.solver.flat import Flat
from autopar.solver.guided import guided_search
from autopar.solver.lagrange import Best, lagrangian
from autopar.solver.progress import Progress
from autopar.solver.reductions import Infeasible, reduce_problem
from autopar.solver.repair import MemoryMoves


def _fitting(flat: Flat) -> list[tuple[float, np.ndarray]]:
    """Every assignment of `flat` that fits, with its objective, cheapest first."""
    found = []
    for choice in itertools.product(*(range(int(k)) for k in flat.sizes)):
        x = np.asarray(choice, dtype=np.int64)
        cost = flat.objective(x)
        if np.isfinite(cost) and (flat.profile(x) <= flat.limit).all():
            found.append((cost, x))
    return sorted(found, key=lambda item: item[0])


def _one_piece(flat: Flat, x: np.ndarray, y: np.ndarray) -> bool:
    differ = np.flatnonzero(x != y).tolist()
    graph = nx.Graph()
    graph.add_nodes_from(differ)
    graph.add_edges_from((i, j) for i in differ for j, _ in flat.nbrs[i] if j in differ)
    return nx.number_connected_components(graph) == 1


def test_a_crossing_fits_never_costs_more_and_takes_a_better_piece_whole():
    rng = np.random.default_rng(3)
    checked = whole = 0
    for _ in range(200):
        try:
            flat = Flat.build(reduce_problem(random_problem(rng, limit="binding")))
        except Infeasible:
            continue
        if not 2 <= flat.num_nodes or np.prod(flat.sizes.astype(float)) > 4000:
            continue
        fitting = _fitting(flat)
        if len(fitting) < 2:
            continue
        (least, optimum), (most, worst) = fitting[0], fitting[-1]
        moves = MemoryMoves(flat)
        child = crossed(flat, moves, worst, optimum)
        assert (flat.profile(child) <= flat.limit).all()
        assert least - 1e-9 <= flat.objective(child) <= most
        if _one_piece(flat, worst, optimum):  # the optimum's piece is cheaper and fits
            assert flat.objective(child) <= least + 1e-9 * abs(least)
            whole += 1
        assert np.array_equal(crossed(flat, moves, worst, worst), moves.descend(
            worst, flat.cost_flat, np.arange(flat.num_nodes)))
        checked += 1
    assert checked >= 30 and whole >= 10


def test_two_searches_local_optima_cross_into_one_cheaper_than_both():
    """From two seeds' Lagrangian phases and guided runs, on memory-bound problems: the
    runs end in different local optima, and each crossed with the other is no dearer,
    and at least once cheaper than both."""
    better = 0
    for seed in range(4):
        flat = Flat.build(reduce_problem(wide_problem(seed, n=200, strategies=20)))
        optima = []
        for start_seed in (0, 1):
            best = Best()
            _, _, prices = lagrangian(flat, best, iterations=5, patience=5, seed=start_seed,
                                      keep_going=lambda: True, report=Progress.silent())
            run = guided_search(flat, best, prices, iterations=40, patience=40,
                                seed=start_seed, keep_going=lambda: True,
                                report=Progress.silent())
            optima.append(run.x)
        a, b = optima
        assert (a != b).any()
        moves = MemoryMoves(flat)
        for x, donor in ((a, b), (b, a)):
            child = crossed(flat, moves, x, donor)
            assert (flat.profile(child) <= flat.limit).all()
            assert flat.objective(child) <= flat.objective(x)
            better += flat.objective(child) < min(flat.objective(a), flat.objective(b))
    assert better >= 1
