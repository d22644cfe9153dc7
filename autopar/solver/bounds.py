"""A cheap proven lower bound on the reduced objective (ignoring memory).

Each edge is charged to its first endpoint at the cheapest partner strategy; each node then
takes its cheapest strategy including the edges it is charged. Any assignment costs at
least that, so it is a valid (if loose) bound for reporting a gap when CP-SAT could not
run on the whole problem.
"""

from __future__ import annotations

import math

from autopar.solver.flat import Flat


def simple_bound(flat: Flat) -> float:
    total = flat.problem.offset
    for i in range(flat.num_nodes):
        row = flat.cost_flat[flat.offsets[i]:flat.offsets[i + 1]].copy()
        for j, m in flat.nbrs[i]:
            if j > i:
                row += m.min(axis=1)
        total += float(row.min())
    return total if not math.isnan(total) else -math.inf


def gap(cost: float, bound: float) -> float:
    """Relative distance between a cost and a lower bound (0 when they meet)."""
    if not math.isfinite(cost) or not math.isfinite(bound):
        return math.inf
    return max(cost - bound, 0.0) / max(abs(cost), 1e-12)

