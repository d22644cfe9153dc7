"""CP-SAT on the whole reduced problem, adding memory constraints lazily.

First the linear relaxation (`lp.py`) when it is cheap: if its bound meets the warm
start's cost, that cost is optimal and CP-SAT is not needed. CP-SAT then starts from the
segments that could bind around the hint; a solution that breaks a segment left out stops
the search, the segment joins, and CP-SAT runs again (hinted with the best feasible
assignment so far). Leaving constraints out only relaxes the problem, so an infeasible
verdict or a lower bound from any round holds for the full one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autopar.solver.budget import DET_PER_SECOND, model_cells
from autopar.solver.cpsat import Limits, SubModel
from autopar.solver.flat import Flat
from autopar.solver.lagrange import Best
from autopar.solver.lp import lp_bound
from autopar.solver.progress import Progress
from autopar.solver.scaling import Scales
from autopar.solver.segments import binding_segments, memory_cells

# Memory constraints built up front; more are added only when an answer breaks one.
FIRST_SEGMENTS = 400
# The linear relaxation is tried first on models up to this many variables, with at most
# this share of the wall time; when it meets the best cost, that cost is proven optimal.
LP_CELLS = 150_000
LP_SHARE = 0.25
LP_SECONDS_PER_CELL = 5e-5


@dataclass(frozen=True)
class Outcome:
    """Status ("optimal", "feasible", "infeasible", "unknown") and proven lower bound."""

    status: str
    bound: float


def solve_whole(flat: Flat, best: Best, hot: np.ndarray, *, deterministic: float,
                wall: Callable[[], float], seed: int, workers: int,
                report: Progress, tolerance: float = 1e-9) -> Outcome:
    """Optimise all nodes with CP-SAT; improves `best` in place.

    `hot` marks segments known to matter (constrained from the start), `deterministic` is
    the CP-SAT deterministic-time budget over all rounds (inf: none), `wall()` the
    wall-clock seconds still available. A best cost within `tolerance` (relative) of the
    linear relaxation's bound ends the search there: "optimal" only within 1e-9.
    """
    scales = Scales.of(flat)
    everyone = np.ones(flat.num_nodes, dtype=bool)
    hint = best.x if best.x is not None else np.zeros(flat.num_nodes, dtype=np.int64)
    chosen = binding_segments(flat, hint, everyone, FIRST_SEGMENTS)
    if hot.sum() <= FIRST_SEGMENTS:
        chosen = np.union1d(chosen, np.flatnonzero(hot))

    def check(y: np.ndarray) -> np.ndarray:
        return np.flatnonzero(flat.profile(y) > flat.limit)

    bound, spent = -math.inf, 0.0
    lp_cells = model_cells(flat) + memory_cells(flat, chosen)
    if best.x is not None and lp_cells <= LP_CELLS:
        # The relaxation's (estimated) time comes out of CP-SAT's budget.
        deterministic -= LP_SECONDS_PER_CELL * lp_cells * DET_PER_SECOND
        bound = lp_bound(flat, chosen, LP_SHARE * wall())
        report.proved(bound)
        report("linear relaxation solved")
        if best.cost <= bound + 1e-9 * abs(best.cost):
            return Outcome("optimal", best.cost)
        if best.cost <= bound + tolerance * abs(best.cost):
            return _found(best, bound)
    if deterministic <= 0.05 or wall() <= 0.05:
        return _found(best, bound)  # no time to build the model
    model = SubModel(flat, scales, hint, everyone)  # built once: the edges dominate
    added = chosen
    for round_ in range(1000):
        budget = deterministic - spent
        if budget <= 0.05 or wall() <= 0.05:
            break
        model.add_memory(added)
        model.hint(hint)
        result = model.solve(Limits(budget, wall(), seed, workers), check)
        spent += max(result.deterministic, 0.05)
        if result.status == "infeasible":
            return Outcome("infeasible", math.inf)
        if best.offer(flat, result.x):
            report(f"cp-sat round {round_}: cost {best.cost:.6g}")
        if result.status != "stopped":
            bound = max(bound, result.bound)
            report.proved(bound)
            if result.status == "optimal":
                # Optimal for a relaxation and feasible for the whole: optimal.
                return Outcome("optimal", best.cost)
            break
        report(f"cp-sat round {round_}: {result.broken.size} more segments to constrain")
        added = np.setdiff1d(result.broken, chosen)
        chosen = np.union1d(chosen, result.broken)
        hint = best.x if best.x is not None else hint
    return _found(best, bound)


def _found(best: Best, bound: float) -> Outcome:
    """The outcome of a search that proved no optimum: `best` if any, and the bound."""
    if best.x is None:
        return Outcome("unknown", bound)
    return Outcome("feasible", min(bound, best.cost))
