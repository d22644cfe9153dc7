"""The whole reduced problem, exactly: HiGHS first, then CP-SAT adding memory rows lazily.

First the linear relaxation (`lp.py`; `linear_phase`, with which a planner's LNS starts
too) when it fits its share of the time: if its bound meets the warm start's cost, that
cost is optimal (or, for a planner, near enough) and nothing else runs; if not, on small
models, HiGHS's branch and bound from the warm start, which closes in a few nodes the
gaps that memory opens, where CP-SAT needs long searches. CP-SAT then, with what time is
left, starts from the segments that could bind around the hint; a solution that breaks a
segment left out stops the search, the segment joins, and CP-SAT runs again (hinted with
the best feasible assignment so far). Leaving constraints out only relaxes the problem,
so an infeasible verdict or a lower bound from any round holds for the full one."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autopar.solver.budget import DET_PER_SECOND, PLANNER_GAP, model_build_seconds, model_cells
from autopar.solver.cpsat import Limits, SubModel
from autopar.solver.flat import Flat
from autopar.solver.lagrange import Best
from autopar.solver.lp import LinearModel
from autopar.solver.progress import Progress
from autopar.solver.scaling import Scales
from autopar.solver.segments import binding_segments, memory_cells

# Memory constraints built up front; more are added only when an answer breaks one.
FIRST_SEGMENTS = 400
# The linear relaxation is tried first, with at most this share of the phase's time (its
# build, estimated per cell of the model, and its simplex iterations, counted at an assumed
# rate: a count keeps the solve repeatable); when it meets the best cost, that cost is
# proven optimal. Otherwise, on models up to `LP_CELLS` variables, branch and bound has
# this share of the time left; CP-SAT's budget is the rest. Measured on 2 cores, the
# planner's problems (Llama shapes, 1.1 to 1.9 million cells with their memory rows) take
# 1.0e-7 to 1.7e-7 s a cell to build and 100 to 150 us an iteration, 1,300 to 2,100 of
# them; generated IOPDDL-like members up to 10 million cells 2.7e-7 to 4.2e-7 s a cell and
# 14 to 540 us an iteration (on those the wall clock, at the same share, stops it first).
# An iteration is counted at `iteration_seconds`: the planner's small ones (the memory-free
# problems of the 405B shape's pipeline stages, 20,000 cells) take 24 us, and counted at
# the large ones' rate they stopped at 430 of the 930 iterations that prove their optimum.
LP_CELLS = 150_000
LP_SHARE = 0.5
LP_BUILD_SECONDS_PER_CELL = 2e-7
LP_ITERATION_SECONDS = 1 / 7_000
LP_ITERATION_BASE_SECONDS = 4e-5
LP_ITERATION_SECONDS_PER_CELL = 8e-11
BRANCH_SHARE = 0.5


@dataclass(frozen=True)
class Outcome:
    """Status ("optimal", "feasible", "infeasible", "unknown") and proven lower bound."""

    status: str
    bound: float


def solve_whole(flat: Flat, best: Best, hot: np.ndarray, *, deterministic: float,
                wall: Callable[[], float], seed: int, workers: int,
                report: Progress, tolerance: float = 1e-9) -> Outcome:
    """Optimise all nodes (module docstring); improves `best` in place.

    `hot` marks segments known to matter (constrained from the start), `deterministic` is
    the budget over all phases in CP-SAT's deterministic time (inf: none; HiGHS's phases
    take their planned share of it), `wall()` the wall-clock seconds still available. A
    best cost within `tolerance` (relative) of a proven bound ends the search there:
    "optimal" only within 1e-9.
    """
    scales = Scales.of(flat)
    everyone = np.ones(flat.num_nodes, dtype=bool)
    hint = best.x if best.x is not None else np.zeros(flat.num_nodes, dtype=np.int64)
    chosen = first_segments(flat, hint, hot)
    highs = linear_phase(flat, best, chosen, deterministic=deterministic, wall=wall,
                         report=report, tolerance=tolerance, saved=model_build_seconds(flat))
    if highs.outcome is not None:
        return highs.outcome
    if highs.deterministic <= 0.05 or wall() <= 0.05:
        return _found(best, highs.bound)  # no time to build the model
    hint = best.x if best.x is not None else hint
    model = SubModel(flat, scales, hint, everyone)  # built once: the edges dominate
    return _cpsat(flat, best, model, hint, chosen, highs.bound, deterministic=highs.deterministic,
                  wall=wall, seed=seed, workers=workers, report=report)


def first_segments(flat: Flat, hint: np.ndarray, hot: np.ndarray) -> np.ndarray:
    """The segments whose memory rows a model starts with: those that could bind around
    `hint` (`FIRST_SEGMENTS` at most), and those `hot` marks when they are not too many."""
    chosen = binding_segments(flat, hint, np.ones(flat.num_nodes, dtype=bool), FIRST_SEGMENTS)
    if hot.sum() <= FIRST_SEGMENTS:
        chosen = np.union1d(chosen, np.flatnonzero(hot))
    return chosen


@dataclass(frozen=True)
class Linear:
    """What HiGHS's phases leave: the bound they proved (-inf when they did not run), the
    deterministic budget less their share, and the outcome when they ended the search."""

    bound: float
    deterministic: float
    outcome: Outcome | None = None


def linear_phase(flat: Flat, best: Best, chosen: np.ndarray, *, deterministic: float,
                 wall: Callable[[], float], report: Progress, tolerance: float,
                 saved: float = 0.0) -> Linear:
    """The linear relaxation of the problem with the memory rows of segments `chosen`, then
    branch and bound from `best` (improving it) when the model is small (module
    docstring); either ends the search when its bound meets `best`'s cost. A model too
    large for branch and bound gets the relaxation only where `tolerance` is a planner's
    (`PLANNER_GAP`): its bound then often closes the gap (the 8B shape's first round, in
    0.9 s, where CP-SAT searched 2.3 to 4 s and did not), while an optimum to be proven to
    1e-9 rarely is by the relaxation alone. Its share is of `deterministic` and of the
    `saved` seconds a bound that closes the gap saves besides (CP-SAT's model building)."""
    lp_cells = model_cells(flat) + memory_cells(flat, chosen)
    branching = lp_cells <= LP_CELLS
    seconds = LP_SHARE * min(deterministic / DET_PER_SECOND + saved, wall())
    build = LP_BUILD_SECONDS_PER_CELL * lp_cells
    if best.x is None or not (branching or tolerance >= PLANNER_GAP) or build > seconds:
        return Linear(-math.inf, deterministic)
    linear = LinearModel(flat, chosen)
    each = iteration_seconds(lp_cells)
    iterations = None if math.isinf(deterministic) else (seconds - build) / each
    relaxed = linear.relax(min(seconds, wall()), iterations)
    deterministic -= (build + relaxed.iterations * each) * DET_PER_SECOND
    bound = relaxed.bound
    report.proved(bound)
    report("linear relaxation solved" if math.isfinite(bound) else
           "linear relaxation unsolved in its share")
    if best.settle(flat, bound, tolerance):
        report("the reference is within the tolerance")
    if not _open(best, bound, tolerance):
        return Linear(bound, deterministic, _closed(best, bound))
    if not branching:
        return Linear(bound, deterministic)
    seconds = BRANCH_SHARE * min(deterministic / DET_PER_SECOND, wall())
    deterministic -= seconds * DET_PER_SECOND
    branched = linear.branch(best.x, tolerance, min(seconds, wall()))
    if best.offer(flat, branched.x):
        report(f"branch and bound: cost {best.cost:.6g}")
    bound = max(bound, branched.bound)
    report.proved(bound)
    report("branch and bound ended")
    if not _open(best, bound, tolerance):
        return Linear(bound, deterministic, _closed(best, bound))
    return Linear(bound, deterministic)


def iteration_seconds(cells: int) -> float:
    """The time a simplex iteration of a relaxation of `cells` cells is counted at:
    `LP_ITERATION_BASE_SECONDS + LP_ITERATION_SECONDS_PER_CELL * cells`, at most
    `LP_ITERATION_SECONDS` (1.7 to 1.2 times what 2 cores take: 24 us at 20,000 cells,
    120 us at 1.5 million)."""
    return min(LP_ITERATION_SECONDS,
               LP_ITERATION_BASE_SECONDS + LP_ITERATION_SECONDS_PER_CELL * cells)


def _cpsat(flat: Flat, best: Best, model: SubModel, hint: np.ndarray, chosen: np.ndarray,
           bound: float, *, deterministic: float, wall: Callable[[], float], seed: int,
           workers: int, report: Progress) -> Outcome:
    """CP-SAT rounds on `model` (module docstring), from the memory rows of segments
    `chosen` and the proven `bound`, each hinted with the best assignment so far (`hint`
    before any), within `deterministic` time in all; improves `best` in place."""

    def check(y: np.ndarray) -> np.ndarray:
        return np.flatnonzero(flat.profile(y) > flat.limit)

    spent = 0.0
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


def _open(best: Best, bound: float, tolerance: float) -> bool:
    """Whether `best`'s cost is more than `tolerance` (relative) above `bound`."""
    return best.cost > bound + tolerance * abs(best.cost)


def _closed(best: Best, bound: float) -> Outcome:
    """The outcome of a search whose bound met `best` within its tolerance: "optimal"
    only within 1e-9."""
    if best.cost <= bound + 1e-9 * abs(best.cost):
        return Outcome("optimal", best.cost)
    return _found(best, bound)


def _found(best: Best, bound: float) -> Outcome:
    """The outcome of a search that proved no optimum: `best` if any, and the bound."""
    if best.x is None:
        return Outcome("unknown", bound)
    return Outcome("feasible", min(bound, best.cost))
