"""`solve`: choose a strategy per node of a `ShardingProblem`, and `min_peak_usage`.

The pipeline: exact reductions (`reductions.py`), a Lagrangian heuristic for a feasible warm
start (`lagrange.py`), then the whole reduced problem when its model is small enough
(`exact.py`: HiGHS's linear relaxation and branch and bound, which prove optimality on our
own torch graphs, then CP-SAT) or large-neighbourhood search with CP-SAT on parts of it
(`lns.py`); a solve that fills its time limit runs the penalty search there instead
(`penalties.py`: toulbar2's answers to memory priced per term, crossed into the
incumbent), then the guided search (`guided.py`). A problem with edge usages is solved in
phases of such solves (`edge_usage_phases.py`).

Two ways to spend the time limit: by default the search goes on until the limit, and
stops early only when the best cost meets a proven lower bound (optimal). A `repeatable`
solve instead gives each phase a work budget planned from the problem's size and the
limit (`budget.py`), so the same input, limit and seed give the same answer on any
machine (the planner's choice: plans are reproducible); the wall clock then only cuts a
phase short on a machine slower than planned.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

import numpy as np

from autopar.errors import ProblemFormatError
from autopar.solver.bounds import simple_bound
from autopar.solver.budget import (
    EXACT_SHARE,
    GUIDED_PATIENCE,
    GUIDED_SHARE,
    LNS_SLICE,
    PLANNER_GAP,
    PRICE_NOISE,
    PhaseBudgets,
    estimate_reduce_seconds,
    finish_seconds,
)
from autopar.solver.crossover import CROSSED_OPTIMA, crossed
from autopar.solver.edge_usage_phases import cost_free, solve_with_edge_usages
from autopar.solver.exact import Outcome, first_segments, linear_phase, solve_whole
from autopar.solver.exhaustive import MAX_ASSIGNMENTS, assignments, enumerate_best
from autopar.solver.flat import Flat
from autopar.solver.guided import guided_search
from autopar.solver.lagrange import Best, lagrangian
from autopar.solver.lns import large_neighbourhoods
from autopar.solver.penalties import penalties_apply, penalty_search
from autopar.solver.problem import ShardingProblem
from autopar.solver.progress import Progress
from autopar.solver.reduced_problem import ReducedProblem
from autopar.solver.reductions import Infeasible, reduce_problem
from autopar.solver.repair import MemoryMoves
from autopar.solver.solution import Solution


def _check_args(time_limit: float, workers: int) -> None:
    if not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise ProblemFormatError("time_limit must be a positive number of seconds",
                                 expected="e.g. 10.0", got=repr(time_limit),
                                 fix="pass time_limit > 0")
    if not (isinstance(workers, int) and workers >= 1):
        raise ProblemFormatError("workers must be a positive integer", expected="e.g. 2",
                                 got=repr(workers), fix="pass workers >= 1")


def solve(problem: ShardingProblem, *, time_limit: float = 10.0, seed: int = 0,
          workers: int = 2, progress: Callable[[str], None] | None = None,
          repeatable: bool = False, initial: tuple[int, ...] | None = None,
          reference: tuple[int, ...] | None = None, fallback: bool = False,
          screening: bool = False) -> Solution:
    """Best assignment found within `time_limit` seconds, with a proven lower bound.

    Returned choices always satisfy `problem.is_feasible`. Status "infeasible" is a proof
    that no assignment fits; "unknown" means none was found in time. `progress` receives
    lines with the clock, objective, bound and gap (`progress.py`); `repeatable` trades
    the rest of the time limit for the same answer on every machine (module docstring).
    `initial`: an assignment to start from, the first incumbent when it fits. `reference`:
    one the caller already has (an earlier round's), not searched from: the search ends on
    it when a bound proves it within the tolerance. A problem with edge usages is solved
    in phases (`edge_usage_phases`), with `fallback` (nothing else to try: a slow plan
    rather than none) and `screening` (many candidates to compare: quicker phases first)."""
    _check_args(time_limit, workers)
    if problem.edge_usages:
        return solve_with_edge_usages(problem, solve, time_limit=time_limit, seed=seed,
                                      workers=workers, progress=progress,
                                      repeatable=repeatable, initial=initial,
                                      reference=reference, fallback=fallback,
                                      screening=screening)
    start = time.monotonic()
    best = Best()
    report = Progress(progress, best, started=start)
    # Seconds kept back from the limit for expanding and checking the answer.
    margin = finish_seconds(problem)

    def left() -> float:
        return time_limit - (time.monotonic() - start)

    def done(choices: tuple[int, ...], cost: float, bound: float, status: str) -> Solution:
        report.proved(bound)
        report(f"{status}: cost {cost:.10g}, bound {bound:.10g}")
        return Solution(choices, cost, bound, status, time.monotonic() - start)

    try:
        reduced = reduce_problem(problem)
    except Infeasible as exc:
        report(f"infeasible: {exc}")
        return done((), math.inf, math.inf, "infeasible")
    report(f"reduced {problem.num_nodes} nodes, {problem.num_edges} edges to "
           f"{reduced.num_nodes} nodes, {len(reduced.edges)} edges")
    if reduced.num_nodes == 0:
        choices = reduced.expand([])
        cost = problem.cost(choices)
        return done(choices, cost, cost, "optimal")
    flat = Flat.build(reduced)
    best.offer(flat, None if initial is None else reduced.restrict(initial))
    best.reference = None if reference is None else reduced.restrict(reference)
    report.proved(cheap_bound := simple_bound(flat))
    # Enumeration runs about 3 million assignments a second: only when that fits.
    if assignments(flat) <= min(MAX_ASSIGNMENTS, 1e6 * time_limit):
        outcome = _enumerate(flat, best, report)
    else:
        outcome = _search(flat, best, time_limit - estimate_reduce_seconds(problem) - margin,
                          left=lambda: left() - margin, seed=seed, workers=workers,
                          repeatable=repeatable, report=report)
    return _answer(problem, reduced, best, outcome, max(outcome.bound, cheap_bound), done)


def _answer(problem: ShardingProblem, reduced: ReducedProblem, best: Best, outcome: Outcome,
            bound: float, done: Callable[..., Solution]) -> Solution:
    """The solve's answer after its search ended in `outcome` with `best` and the proven
    `bound`: `done(choices, cost, bound, status)` of the problem before reductions."""
    if outcome.status == "infeasible":
        return done((), math.inf, math.inf, "infeasible")
    if best.x is None:
        return done((), math.inf, bound, "unknown")
    choices = reduced.expand(best.x)
    assert problem.is_feasible(choices), "a reduced solution must expand to a feasible one"
    cost = problem.cost(choices)
    status = "optimal" if outcome.status == "optimal" else "feasible"
    return done(choices, cost, cost if status == "optimal" else min(bound, cost), status)


def _search(flat: Flat, best: Best, seconds: float, *, left: Callable[[], float], seed: int,
            workers: int, repeatable: bool, report: Progress) -> Outcome:
    """Lagrangian warm start, then CP-SAT on the whole problem, or (larger problems) LNS
    on a work budget when `repeatable`, else guided search and LNS until the limit; a
    whole-problem search that ends unproven leaves its time to those."""
    budgets = PhaseBudgets.of(flat, seconds, repeatable=repeatable)
    tolerance = PLANNER_GAP if repeatable else 1e-9

    def open_gap() -> bool:
        return best.cost > report.bound + tolerance * abs(best.cost)

    def searching() -> bool:  # the later phases': time left, before the answer is due
        return left() > 0.5 and open_gap()

    hot, ran, prices = lagrangian(flat, best, iterations=budgets.lagrange_iterations,
                                  patience=budgets.patience, seed=seed,
                                  keep_going=lambda: left() > 0 and open_gap(),
                                  report=report)
    bound = -math.inf
    penalties = not repeatable and best.x is not None and penalties_apply(flat)
    if budgets.exact:
        # Beside the penalty search, the whole model has a share of the time: CP-SAT that
        # has not proven its answer by then rarely improves it (a generated member of
        # 2,460 nodes: 0.987 points after 37 s of CP-SAT, 1.000 by the penalty search).
        kept = (1 - EXACT_SHARE) * left() if penalties else 0.0
        outcome = solve_whole(flat, best, hot, deterministic=budgets.deterministic(ran),
                              wall=lambda: left() - kept, seed=seed, workers=workers,
                              report=report, tolerance=tolerance)
        if repeatable or outcome.status in ("optimal", "infeasible"):
            return outcome
        bound = outcome.bound
    if repeatable:
        # A linear bound may close the gap first (`exact.linear_phase`), as it does on
        # the whole problem; LNS has what it leaves. Work counted in CP-SAT's
        # deterministic time only: the guided search's iteration time is not modelled
        # well enough yet to budget it without overrunning.
        deterministic = budgets.lns_deterministic(ran)
        if best.x is not None:
            linear = linear_phase(flat, best, first_segments(flat, best.x, hot),
                                  deterministic=deterministic, wall=left, report=report,
                                  tolerance=tolerance)
            if linear.outcome is not None:
                return linear.outcome
            deterministic, bound = linear.deterministic, max(bound, linear.bound)
        large_neighbourhoods(flat, best, deterministic=deterministic,
                             seed=seed, keep_going=searching, wall=left, report=report)
    else:
        # The penalty search where it can run, but for the last GUIDED_SHARE of the time:
        # the guided search's, from the incumbent the crossings made (elsewhere, all).
        if penalties:
            guided = GUIDED_SHARE * left()
            penalty_search(flat, best, workers=workers, seed=seed, keep_going=searching,
                           wall=lambda: left() - guided, report=report)
        _alternate(flat, best, prices, seed=seed, keep_going=searching, wall=left,
                   report=report, restart=functools.partial(
                       _lagrangian_start, flat, budgets, searching))
    if best.x is None:
        return Outcome("unknown", bound)
    proved = best.cost <= report.bound + 1e-9 * abs(best.cost)
    return Outcome("optimal" if proved else "feasible", bound)


def _lagrangian_start(flat: Flat, budgets: PhaseBudgets, keep_going: Callable[[], bool],
                      seed: int) -> tuple[np.ndarray | None, np.ndarray]:
    """A Lagrangian phase of its own from `seed` (`budgets`' iterations): its best assignment
    that fits (None if none) and its prices, where `_alternate` restarts a run."""
    fresh = Best()
    _, _, prices = lagrangian(flat, fresh, iterations=budgets.lagrange_iterations,
                              patience=budgets.patience, seed=seed, keep_going=keep_going,
                              report=Progress.silent())
    return fresh.x, prices


def _alternate(flat: Flat, best: Best, prices: np.ndarray, *, seed: int,
               keep_going: Callable[[], bool], wall: Callable[[], float],
               report: Progress,
               restart: Callable[[int], tuple[np.ndarray | None, np.ndarray]] | None = None
               ) -> None:
    """Guided-search runs until `keep_going()` fails, alternately from the incumbent and
    from a Lagrangian's assignment; nothing runs while no assignment is known.

    A run ends once `GUIDED_PATIENCE` iterations in a row found nothing better than its
    own best. Restarted with the same prices the search returns to the same local
    optimum, and even a shaken restart from the incumbent mostly returns to its basin:
    one trajectory stalls there however long it runs (IOPDDL's S: 0.964 and 0.958 points
    after 45 s and still after 180 s, two seeds). So every other run starts from a
    Lagrangian's assignment: the second from the first phase's, its prices times
    lognormal noise (sigma PRICE_NOISE, one factor per segment), and the later ones from
    a Lagrangian phase of their own (`restart(seed)`, its assignment and prices), while
    the runs from the incumbent refine the best basin found. Restarts from one assignment
    ended within 200 nodes of each other on S; those from another seed's Lagrangian, 700
    to 1,500 nodes away, in other basins. After each run the incumbent is crossed with
    the runs' local optima (`crossover.crossed`, the newest `CROSSED_OPTIMA`; with the
    older ones only once it has changed). On S (240 s, seeds 0, 1, 2) the Lagrangian
    restarts and the crossing raised the score from 0.964 (0.964 to 0.975 over seeds
    before) to 0.984, 0.976 and 0.979. A run that found nothing better hands a slice of
    LNS its incumbent: CP-SAT re-optimises regions exactly, which forest moves cannot on
    dense graphs.
    """
    rng = np.random.default_rng(seed)
    lagrangian_x = best.x
    shaken, cycle = prices, 0
    moves, optima = MemoryMoves(flat), []  # the runs' own local optima, newest first
    crossed_at = math.inf  # the incumbent's cost when it was last crossed with them all
    while best.x is not None and keep_going():
        before = best.cost
        start = lagrangian_x if cycle % 2 else best.x
        if cycle % 2 and cycle > 1 and restart is not None:
            fresh_x, fresh_prices = restart(seed + cycle)
            if fresh_x is not None:
                start, shaken = fresh_x, fresh_prices
        run = guided_search(flat, best, shaken, iterations=10**9, patience=GUIDED_PATIENCE,
                            seed=seed + cycle, keep_going=keep_going, report=report,
                            start=start)
        if run.x is not None:
            optima = [run.x, *optima][:CROSSED_OPTIMA]
            # An incumbent crossed with the older optima before gains only from the new one.
            for donor in optima if best.cost < crossed_at else optima[:1]:
                if keep_going() and best.offer(flat, crossed(flat, moves, best.x, donor)):
                    report(f"crossover after guided run {cycle}")
            crossed_at = best.cost
        shaken = prices * rng.lognormal(0.0, PRICE_NOISE, prices.size)
        cycle += 1
        if best.cost < before or not keep_going():
            continue
        large_neighbourhoods(flat, best, deterministic=LNS_SLICE, seed=seed + cycle,
                             keep_going=keep_going, wall=wall, report=report)


def _enumerate(flat: Flat, best: Best, report: Progress) -> Outcome:
    x = enumerate_best(flat)
    report(f"enumerated all {int(assignments(flat))} assignments")
    if x is None:
        return Outcome("infeasible", math.inf)
    best.offer(flat, x)
    return Outcome("optimal", best.cost)


def min_peak_usage(problem: ShardingProblem, *, time_limit: float = 10.0) -> float:
    """Least peak usage of any finite-cost assignment (costs ignored); inf if none exists.

    Bisection on the limit, each step a feasibility solve. When time runs out before the
    bisection closes, the result is the smallest peak actually achieved (an upper bound).
    """
    _check_args(time_limit, 1)
    start = time.monotonic()
    free = cost_free(problem, None)
    first = solve(free, time_limit=max(time_limit / 4, 0.2), workers=1, repeatable=True)
    if not first.choices:
        return math.inf
    hi = problem.peak_usage(first.choices)
    integral = all(np.array_equal(u, np.round(u)) for u in (
        *problem.node_usages, *(e.usages for e in problem.edge_usages)))
    lo = 0.0
    while hi - lo > (0.5 if integral else 1e-9 * max(abs(hi), 1.0)):
        left = time_limit - (time.monotonic() - start)
        if left <= 0.05:
            break
        mid = math.floor((lo + hi) / 2) if integral else (lo + hi) / 2
        if mid >= hi:
            break
        trial = solve(cost_free(problem, mid), time_limit=max(min(left, time_limit / 4), 0.05),
                      workers=1, repeatable=True)
        if trial.choices:
            hi = problem.peak_usage(trial.choices)
        elif trial.status == "infeasible":
            lo = mid + 1 if integral else mid
        else:
            break
    return float(hi)
