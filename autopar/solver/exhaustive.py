"""Exhaustive search for tiny reduced problems.

After the reductions a problem is sometimes down to a handful of nodes with many
strategies and a binding memory limit: a few million assignments, which numpy evaluates in
chunks in about a second, while CP-SAT's search (its LP bound weakened by the memory rows)
can take ten. Exact, deterministic; ties keep the lowest assignment in mixed-radix order.
"""

from __future__ import annotations

import math

import numpy as np

from autopar.solver.flat import Flat

# Largest number of assignments enumerated, and the number of array cells one chunk of
# them may occupy (assignments times segments).
MAX_ASSIGNMENTS = 10_000_000
CHUNK_CELLS = 1 << 22


def assignments(flat: Flat) -> float:
    """Number of assignments of the reduced problem (as a float: it may be huge)."""
    return math.prod(float(k) for k in flat.sizes)


def enumerate_best(flat: Flat) -> np.ndarray | None:
    """The cheapest assignment that fits in memory, or None if none fits."""
    sizes = flat.sizes
    n = sizes.size
    total = int(assignments(flat))
    radix = np.concatenate([[1], np.cumprod(sizes[::-1])[:-1]])[::-1]  # node 0 most significant
    best_cost, best_index = math.inf, -1
    nseg = flat.problem.base.size
    chunk = max(CHUNK_CELLS // (nseg + flat.term_node.size + n + 1), 256)
    cover = None  # terms x segments: 1 where the term is live
    if nseg and math.isfinite(flat.limit):
        cover = np.zeros((flat.term_node.size, nseg))
        for t, (lo, hi) in enumerate(zip(flat.term_lo, flat.term_hi)):
            cover[t, lo:hi] = 1.0
    for start in range(0, total, chunk):
        index = np.arange(start, min(start + chunk, total), dtype=np.int64)
        x = (index[:, None] // radix[None, :]) % sizes[None, :]  # chunk x n
        cost = flat.cost_flat[flat.offsets[:-1][None, :] + x].sum(axis=1)
        for e in range(flat.edge_a.size):
            a, b = flat.edge_a[e], flat.edge_b[e]
            cost += flat.edge_flat[flat.edge_off[e] + x[:, a] * flat.edge_cols[e] + x[:, b]]
        if cover is not None:
            values = flat.term_flat[flat.term_off[None, :] + x[:, flat.term_node]]
            profile = flat.problem.base[None, :] + values @ cover
            cost[(profile > flat.limit).any(axis=1)] = math.inf
        k = int(np.argmin(cost))
        if cost[k] < best_cost:
            best_cost, best_index = float(cost[k]), start + k
    if best_index < 0:
        return None
    return ((best_index // radix) % sizes).astype(np.int64) if n else np.zeros(0, np.int64)
