"""Lagrangian heuristic: price memory per segment, solve the priced problem, adjust prices.

With a price per byte on every segment, memory becomes an ordinary node cost and the
problem is unconstrained; TRW-S sweeps (warm-started across iterations) and induced-forest
block moves solve it approximately. Prices follow projected subgradient steps of Polyak's
size toward the best feasible cost; every iterate is repaired to fit memory and polished
with memory-safe descent, and the best feasible assignment is kept. The run is a fixed
sequence of operations for a given seed: only the number of iterations depends on time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autopar.solver.flat import Flat
from autopar.solver.forest import forest_dp, random_forest
from autopar.solver.progress import Progress
from autopar.solver.repair import MemoryMoves
from autopar.solver.trws import Trws

# Iterations run past the deadline while no feasible assignment is known (each a TRW-S
# sweep and a repair: milliseconds on reduced problems).
FIRST_FEASIBLE_TRIES = 5


@dataclass
class Best:
    """The best feasible assignment found so far (mutable record of a search)."""

    x: np.ndarray | None = None
    cost: float = math.inf
    # An answer the caller already has (`solve`'s `reference`): not searched from, only
    # taken once a bound proves it near enough (`settle`).
    reference: np.ndarray | None = None

    def offer(self, flat: Flat, x: np.ndarray | None) -> bool:
        if x is None or not (flat.profile(x) <= flat.limit).all():
            return False
        cost = flat.objective(x)
        if cost < self.cost:
            self.x, self.cost = x.copy(), cost
            return True
        return False

    def settle(self, flat: Flat, bound: float, tolerance: float) -> bool:
        """Take the reference when it is cheaper than the best and within `tolerance`
        (relative) of the proven `bound`; whether it was taken."""
        if self.reference is None:
            return False
        cost = flat.objective(self.reference)
        return cost <= bound + tolerance * abs(cost) and self.offer(flat, self.reference)


def _big(flat: Flat) -> float:
    values = np.concatenate([flat.cost_flat, flat.edge_flat])
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if finite.size else 1.0
    return min(max(top, 1.0) * 1e4, 1e15)


def polish(flat: Flat, costs: np.ndarray, x: np.ndarray, rng: np.random.Generator,
           rounds: int) -> np.ndarray:
    """Induced-forest block descent on `costs` (no memory check)."""
    for _ in range(rounds):
        x = forest_dp(flat, costs, x, random_forest(flat, rng.permutation(flat.num_nodes)))
    return x


def lagrangian(flat: Flat, best: Best, *, iterations: int, patience: int, seed: int,
               keep_going: Callable[[], bool],
               report: Progress) -> tuple[np.ndarray, int, np.ndarray]:
    """Run up to `iterations` price updates (while `keep_going()`, or, until a feasible
    assignment is known, past it: a solve whose reductions used up its time still
    returns a plan when its first iterates find one); update `best`.

    Stops early once a feasible assignment is known and `patience` iterations in a row
    have not improved it. Returns a mask of the segments that some iterate pushed over
    the limit (the memory constraints that matter, for CP-SAT to start with), the
    number of iterations run, and the segment prices of the iteration that found the
    best assignment (where the guided search starts).
    """
    rng = np.random.default_rng(seed)
    nseg = flat.problem.base.size
    prices = _Prices(np.zeros(nseg))
    trws = Trws(flat, _big(flat))
    moves = MemoryMoves(flat)
    limit = flat.limit
    best_prices = prices.lam
    hot = np.zeros(nseg, dtype=bool)
    quiet = done = 0
    for it in range(iterations):
        if (best.x is not None and (quiet >= patience or not keep_going())) or (
                not keep_going() and it >= FIRST_FEASIBLE_TRIES):
            break
        quiet += 1
        done += 1
        costs = flat.priced(prices.lam)
        x = trws.sweep(costs, forward=it % 2 == 0)
        x = polish(flat, costs, x, rng, 2)
        prof = flat.profile(x)
        excess = prof - limit
        hot |= excess > 0
        dual = flat.objective(x) + float(prices.lam @ excess)
        fits = not (excess > 0).any()
        if best.offer(flat, moves.fitted(x, fits, rng)):
            quiet, best_prices = 0, prices.lam
            report(f"lagrangian iteration {it}")
        else:
            report.tick(f"lagrangian iteration {it}")
        if not math.isfinite(limit) or nseg == 0 or not math.isfinite(dual):
            continue  # nothing (sensible) to price: later sweeps only refine the messages
        prices = prices.stepped(excess, dual, best.cost)
    return hot, done, best_prices


@dataclass(frozen=True)
class _Prices:
    """The segment prices `lam` and their step size: Polyak's, scaled by `theta`, which
    halves after 5 iterations in a row that did not raise the best dual bound
    (`best_dual`; `stall` counts them)."""

    lam: np.ndarray
    theta: float = 1.0
    stall: int = 0
    best_dual: float = -math.inf

    def stepped(self, excess: np.ndarray, dual: float, best_cost: float) -> _Prices:
        """The prices after a projected subgradient step from an iterate over the limits
        by `excess` (negative: under them) with dual bound `dual`, toward `best_cost` (the
        best feasible cost, inf while none is known)."""
        theta, stall, best_dual = self.theta, self.stall, self.best_dual
        if dual > best_dual + 1e-9 * abs(best_dual):
            best_dual, stall = dual, 0
        else:
            stall += 1
            if stall >= 5:
                theta, stall = theta / 2, 0
        g = np.where((self.lam > 0) | (excess > 0), excess, 0.0)
        norm = float(g @ g)
        if norm == 0:
            return _Prices(self.lam, theta, stall, best_dual)
        target = best_cost if math.isfinite(best_cost) else 1.5 * abs(dual) + 1.0
        step = theta * max(target - dual, 0.05 * abs(dual)) / norm
        return _Prices(np.maximum(self.lam + step * g, 0.0), theta, stall, best_dual)
