"""The vectorised local costs and the descent that skips nodes which cannot gain, against
the node-by-node definitions."""

from __future__ import annotations

import numpy as np
from solver_cases import random_problem
from test_time_use import wide_problem

from autopar.solver.flat import Flat
from autopar.solver.forest import forest_dp, random_forest
from autopar.solver.reductions import Infeasible, reduce_problem
from autopar.solver.repair import MemoryMoves


def _flats(rng: np.random.Generator, count: int, limit: str = "none") -> list[Flat]:
    """A memory-bound chain with shortcuts, then small random problems."""
    out = [Flat.build(reduce_problem(wide_problem(7, n=200, strategies=20)))]
    while len(out) < count:
        try:
            flat = Flat.build(reduce_problem(random_problem(rng, limit=limit)))
        except Infeasible:
            continue
        if flat.num_nodes:
            out.append(flat)
    return out


def _assignment(flat: Flat, rng: np.random.Generator) -> np.ndarray:
    return np.array([rng.integers(k) for k in flat.sizes], dtype=np.int64)


def test_with_neighbours_is_local_for_every_node() -> None:
    rng = np.random.default_rng(5)
    for flat in _flats(rng, 40):
        x = _assignment(flat, rng)
        # Integers: both sums are exact, whatever their order.
        costs = flat.cost_flat + rng.integers(0, 100, flat.cost_flat.size)
        every = flat.with_neighbours(x, costs)
        outside = rng.random(flat.num_nodes) < 0.5
        some = flat.with_neighbours(x, costs, outside=outside)
        for i in range(flat.num_nodes):
            cells = slice(flat.offsets[i], flat.offsets[i + 1])
            np.testing.assert_array_equal(every[cells], flat.local(i, x, costs))
            expected = costs[cells].copy()
            for j, m in flat.nbrs[i]:
                if outside[j]:
                    expected += m[:, x[j]]
            np.testing.assert_array_equal(some[cells], expected)


def _descend_every_node(moves: MemoryMoves, x: np.ndarray, costs: np.ndarray,
                        order: np.ndarray) -> np.ndarray:
    """The plain pass: every node visited, its cheapest strategy with room taken."""
    flat, x = moves.flat, x.copy()
    prof = flat.profile(x)
    for i in order:
        local = flat.local(int(i), x, costs)
        local[~moves._room(int(i), x, prof)] = np.inf
        k = int(np.argmin(local))
        if local[k] < local[x[i]]:
            moves.switch(int(i), k, x, prof)
    return x


def test_descent_skipping_idle_nodes_equals_the_plain_pass() -> None:
    rng = np.random.default_rng(8)
    moved = 0
    for flat in _flats(rng, 100, limit="binding"):
        moves = MemoryMoves(flat)
        x = moves.repair(_assignment(flat, rng), flat.cost_flat, 50)
        if x is None or not np.isfinite(flat.objective(x)):
            continue
        order = rng.permutation(flat.num_nodes)
        fast = moves.descend(x, flat.cost_flat, order)
        np.testing.assert_array_equal(fast, _descend_every_node(moves, x, flat.cost_flat, order))
        assert flat.objective(fast) <= flat.objective(x)
        moved += int((fast != x).any())
    assert moved >= 10


def test_forest_move_is_optimal_over_the_forest() -> None:
    """Brute force over the forest's nodes (others fixed) on small forests."""
    rng = np.random.default_rng(3)
    checked = 0
    for flat in _flats(rng, 60)[1:]:
        x = _assignment(flat, rng)
        forest = random_forest(flat, rng.permutation(flat.num_nodes))
        if np.prod(flat.sizes[forest.nodes].astype(float)) > 5000:
            continue
        y = forest_dp(flat, flat.cost_flat, x, forest)
        best = np.inf
        for choice in np.ndindex(*flat.sizes[forest.nodes]):
            z = x.copy()
            z[forest.nodes] = choice
            best = min(best, flat.objective(z))
        assert flat.objective(y) == best or (np.isinf(best) and np.isinf(flat.objective(y)))
        checked += 1
    assert checked >= 20
