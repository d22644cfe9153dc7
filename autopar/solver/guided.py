"""Guided search: forest moves on memory-priced costs, with prices that follow the overflow.

Each iteration re-chooses a random induced forest of nodes exactly (`forest.py`) on the
node costs plus a price per byte on every segment (`Flat.priced`), starting from the
current assignment. Then the prices move: on a segment the assignment overflows,

    price <- price * (1 + RAISE) + RAISE * scale * overflow / limit

(`scale`: cost per byte of the incumbent, so the first step is in the right units), and
elsewhere `price <- price * (1 - DECAY)`. Memory is thus a soft constraint whose penalty
grows where it is broken and fades where it is not, and the search keeps sliding along
the limit instead of stopping at the first assignment that fits (a guided local search
in the manner of breakout methods). Assignments that fit and come close to the best are
polished by memory-safe descent on the true costs (`repair.py`) and offered; every
`REPAIR_EVERY`-th overflowing one is first repaired greedily. When nothing better has
turned up for a while, all prices drop at once, and again periodically (`KICK_EVERY`,
`RELAX`), and the search crosses the limit somewhere else.

On memory-bound problems this moves much further than the Lagrangian's subgradient steps
in the same time (IOPDDL's S: from 1.75e9 to 1.59e9 in 30 s, where LNS reaches 1.66e9 in
90 s): a forest move costs about a tenth of a TRW-S sweep and the prices need no step
size. Without a memory limit it is plain forest descent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autopar.solver.flat import Flat
from autopar.solver.forest import forest_dp, random_forest
from autopar.solver.lagrange import Best
from autopar.solver.progress import Progress
from autopar.solver.repair import MemoryMoves

RAISE, DECAY = 0.5, 0.1
REPAIR_EVERY = 5
# Once this many iterations in a row found no better assignment, every price is
# multiplied by RELAX every KICK_EVERY iterations: the search falls into overflow on
# cheaper strategies and the prices climb back, so it leaves the memory boundary at one
# point and returns at another (strategic oscillation). Without it the search settles
# into one local optimum (IOPDDL's S: 0.965 points for 60 s more; with it 0.975).
KICK_EVERY, RELAX = 20, 0.3
# A fitting iterate is polished when its cost is within this factor of the best.
NEAR = 1.01


@dataclass(frozen=True, eq=False)
class GuidedRun:
    """What a guided search ran: its `iterations`, and the best assignment that fits it
    found itself (`x`, None when it ran none): its local optimum, which a restart's may
    improve in pieces (`crossover.py`)."""

    iterations: int
    x: np.ndarray | None


def guided_search(flat: Flat, best: Best, prices: np.ndarray, *, iterations: int,
                  patience: int, seed: int, keep_going: Callable[[], bool],
                  report: Progress, start: np.ndarray | None = None) -> GuidedRun:
    """Run up to `iterations` iterations from `start` (default `best.x`, which must fit) and
    segment `prices`, while `keep_going()` and until `patience` iterations in a row find
    nothing better than the run's own best; improve `best` in place."""
    start = best.x if start is None else start
    if start is None or flat.num_nodes == 0:
        return GuidedRun(0, None)
    rng = np.random.default_rng(seed)
    moves = MemoryMoves(flat)
    limit = flat.limit
    bounded = np.isfinite(limit) and flat.problem.base.size > 0
    # The run's own best: a run from elsewhere than the incumbent polishes and measures
    # its progress against where it stands, not against a better assignment it left.
    own = Best()
    own.offer(flat, start)
    usage = float(flat.profile(start).sum()) if bounded else 0.0
    scale = own.cost / usage if usage > 0 else 0.0
    prices = prices.copy()
    x = start.copy()
    quiet, oscillating = 0, False
    for it in range(iterations):
        if quiet >= patience or not keep_going():
            return GuidedRun(it, own.x)
        quiet += 1
        oscillating = oscillating or quiet >= KICK_EVERY
        costs = flat.priced(prices) if bounded else flat.cost_flat
        x = forest_dp(flat, costs, x, random_forest(flat, rng.permutation(flat.num_nodes)))
        overflow = flat.profile(x) - limit if bounded else np.zeros(0)
        over = overflow > 0
        if not over.any():
            candidate = x if flat.objective(x) < own.cost * NEAR else None
        elif it % REPAIR_EVERY == 0:
            candidate = moves.repair(x, flat.cost_flat, 20)
        else:
            candidate = None
        if candidate is not None:
            candidate = moves.descend(candidate, flat.cost_flat,
                                      rng.permutation(flat.num_nodes))
        # `best` is never worse than the run's own best, so only a gain of the run's can
        # be one of `best`'s: it alone is offered twice.
        gained = own.offer(flat, candidate)
        if gained:
            quiet = 0
        if gained and best.offer(flat, candidate):
            report(f"guided search iteration {it}")
        else:
            report.tick(f"guided search iteration {it}")
        if bounded:
            prices = np.where(over, prices * (1 + RAISE) + RAISE * scale * overflow / limit,
                              prices * (1 - DECAY))
            if oscillating and it % KICK_EVERY == 0:
                prices *= RELAX
    return GuidedRun(iterations, own.x)
