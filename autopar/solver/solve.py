"""`solve`: choose a strategy per node of a `ShardingProblem`, and `min_peak_usage`.

The pipeline: exact reductions (`reductions.py`), a Lagrangian heuristic for a feasible warm
start (`lagrange.py`), then the whole reduced problem when its model is small enough
(`exact.py`: HiGHS's linear relaxation and branch and bound, which prove optimality on our
own torch graphs, then CP-SAT) or large-neighbourhood search with CP-SAT on parts of it
(`lns.py`).

Two ways to spend the time limit: by default the search goes on until the limit, and
stops early only when the best cost meets a proven lower bound (optimal). A `repeatable`
solve instead gives each phase a work budget planned from the problem's size and the
limit (`budget.py`), so the same input, limit and seed give the same answer on any
machine (the planner's choice: plans are reproducible); the wall clock then only cuts a
phase short on a machine slower than planned.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from autopar.errors import ProblemFormatError
from autopar.solver.bounds import simple_bound
from autopar.solver.budget import (
    GUIDED_PATIENCE,
    LNS_SLICE,
    PLANNER_GAP,
    PRICE_NOISE,
    PhaseBudgets,
    estimate_reduce_seconds,
    finish_seconds,
)
from autopar.solver.edge_usage import around, expansion_cells, relaxation, with_usage_nodes
from autopar.solver.exact import Outcome, first_segments, linear_phase, solve_whole
from autopar.solver.exhaustive import MAX_ASSIGNMENTS, assignments, enumerate_best
from autopar.solver.flat import Flat
from autopar.solver.guided import guided_search
from autopar.solver.lagrange import Best, lagrangian
from autopar.solver.lns import large_neighbourhoods
from autopar.solver.problem import ShardingProblem
from autopar.solver.progress import Progress
from autopar.solver.reductions import Infeasible, reduce_problem
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
          repeatable: bool = False, initial: tuple[int, ...] | None = None) -> Solution:
    """Best assignment found within `time_limit` seconds, with a proven lower bound.

    Returned choices always satisfy `problem.is_feasible`. Status "infeasible" is a proof
    that no assignment fits; "unknown" means none was found in time. `progress` receives
    lines with the clock, objective, bound and gap (`progress.py`); `repeatable` trades
    the rest of the time limit for the same answer on every machine (module docstring).
    `initial`: an assignment to start from, the first incumbent when it fits."""
    _check_args(time_limit, workers)
    if problem.edge_usages:
        return _with_edge_usages(problem, time_limit, seed, workers, progress, repeatable,
                                 initial=initial)
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
    cheap_bound = simple_bound(flat)
    report.proved(cheap_bound)
    # Enumeration runs about 3 million assignments a second: only when that fits.
    if assignments(flat) <= min(MAX_ASSIGNMENTS, 1e6 * time_limit):
        outcome = _enumerate(flat, best, report)
    else:
        outcome = _search(flat, best, time_limit - estimate_reduce_seconds(problem) - margin,
                          left=lambda: left() - margin, seed=seed, workers=workers,
                          repeatable=repeatable, report=report)
    if outcome.status == "infeasible":
        return done((), math.inf, math.inf, "infeasible")
    bound = max(outcome.bound, cheap_bound)
    if best.x is None:
        return done((), math.inf, bound, "unknown")
    choices = reduced.expand(best.x)
    assert problem.is_feasible(choices), "a reduced solution must expand to a feasible one"
    cost = problem.cost(choices)
    status = "optimal" if outcome.status == "optimal" else "feasible"
    return done(choices, cost, cost if status == "optimal" else min(bound, cost), status)


# Solves of a problem with edge usages (`_with_edge_usages`): the relaxation at the limit,
# the usages around its answer (at most `LINEARIZED` solves), the relaxation at lower
# limits (`LOWER_LIMITS` solves), and the exact expansion, given these shares of the time
# limit. On seven stage problems of a 126-layer Llama over 8x8x8, whose relaxed answers
# overflowed their true usages by 20% to 80%, the usages around them made the fitting
# answers of four 1.9 to 9.5 times cheaper than lower limits alone (one 1.2 times, one the
# same, one found none either way), in a quarter less time.
EDGE_USAGE_SHARES = (0.25, 0.25, 0.25, 0.25)
LINEARIZED = 2
LOWER_LIMITS = 4
# After an answer around the relaxation's that fits, the exact phase only refines: its
# expansion is built only when reducing it takes at most this share of what it may take
# otherwise (`EXPANSION_SHARE`). On the Llama shapes' problems (70B on 8x8, the 405B
# shape's stages) it found nothing cheaper in 1 to 2 s a solve, mostly spent reducing the
# expansion; a small problem's expansion, reduced in milliseconds, is still searched (and
# its optimum found, as tests/passes/problem/test_edge_memory.py's brute force checks).
REFINE_SHARE = 0.1
# When none of the relaxation's answers fits, this share of the exact phase's looks for any
# answer that fits, costs aside, for the exact solve to start from.
FIT_SHARE = 0.25
# The exact expansion is solved only when reducing it (about REDUCE_SECONDS_PER_CELL a cell
# of its cost matrices, on 2 cores) takes at most EXPANSION_SHARE of the exact phase: the
# usage nodes of a model with hundreds of strategies per op can hold hundreds of millions
# of cells, seconds to minutes before any search.
REDUCE_SECONDS_PER_CELL = 4e-8
EXPANSION_SHARE = 0.5


def _with_edge_usages(problem: ShardingProblem, time_limit: float, seed: int, workers: int,
                      progress: Callable[[str], None] | None, repeatable: bool,
                      any_fit: bool = True, initial: tuple[int, ...] | None = None) -> Solution:
    """`solve` of a problem with edge usages (`edge_usage.py`'s docstring): with each of
    them at its least over its first end (`edge_usage.relaxation`: its answer is the
    problem's when it fits, and its bound holds); unless that answer fits, with them as
    that answer pays them (`_linearized`); while none fits, the relaxation under lower
    limits (`_lower_limits`); then exactly (`_exact`, when its expansion is small enough:
    `REFINE_SHARE` of that after a linearized answer that fits), started from
    the cheapest answer that fits (or, when none does and `any_fit`, any that fits:
    `FIT_SHARE`). Each phase gets its share of the limit
    (`EDGE_USAGE_SHARES`); only the relaxation's and the exact phase's bounds hold. An
    `initial` assignment that fits is an answer like the others."""
    start, shares = time.monotonic(), [share * time_limit for share in EDGE_USAGE_SHARES]
    options = dict(seed=seed, workers=workers, progress=progress, repeatable=repeatable)
    given = _given(problem, initial)
    relaxed_problem = with_usage_nodes(relaxation(problem))
    relaxed = _truncated(solve(relaxed_problem, time_limit=shares[0], **options), problem)
    if relaxed.status == "infeasible" or _best_fit(problem, [relaxed]) is not None:
        # An answer of the relaxation that fits is one of the problem's at the same cost,
        # and the relaxation's optimum bounds the problem's: the exact search (larger, its
        # moves blocked by the usage nodes' ties) would start from it and rarely do better.
        return dataclasses.replace(relaxed, wall_time=time.monotonic() - start)
    answers = [relaxed] + _linearized(problem, relaxed, shares[1], options)
    refining = _best_fit(problem, answers) is not None
    if not refining:
        answers += _lower_limits(problem, relaxed_problem, relaxed, shares[2], options)
    answers += [given] if given else []
    if _best_fit(problem, answers) is None and any_fit:  # costs aside, any that fits
        found = _with_edge_usages(_memory_weighted(problem), shares[3] * FIT_SHARE,
                                  any_fit=False, **options)
        answers.append(_truncated(found, problem))
        shares[3] *= 1 - FIT_SHARE
    exact = _exact(problem, _best_fit(problem, answers), shares[3], options,
                   EXPANSION_SHARE * (REFINE_SHARE if refining else 1.0))
    best = _best_fit(problem, [*answers, exact])
    bound = max(relaxed.bound, exact.bound)
    if best is None:
        return Solution((), math.inf, bound, exact.status if exact.status == "infeasible"
                        else "unknown", time.monotonic() - start)
    status = "optimal" if best.cost <= bound + 1e-9 * abs(best.cost) else "feasible"
    return dataclasses.replace(best, bound=min(bound, best.cost), status=status,
                               wall_time=time.monotonic() - start)


def _exact(problem: ShardingProblem, start: Solution | None, seconds: float,
           options: dict, expansion_share: float = EXPANSION_SHARE) -> Solution:
    """`problem` solved with its edge usages as nodes (`with_usage_nodes`) from `start`, in
    `seconds`, restricted to its own nodes; no answer when that expansion is too large to
    reduce in `expansion_share` of `seconds`."""
    if expansion_cells(problem) * REDUCE_SECONDS_PER_CELL > expansion_share * seconds:
        return Solution((), math.inf, -math.inf, "unknown", 0.0)
    expanded = with_usage_nodes(problem)
    exact = solve(expanded, time_limit=seconds, initial=_completed(expanded, start),
                  **options)
    return _truncated(exact, problem)


def _linearized(problem: ShardingProblem, relaxed: Solution, seconds: float,
                options: dict) -> list[Solution]:
    """Answers of `problem` with its edge usages around the answer before
    (`edge_usage.around`, first `relaxed`'s), `LINEARIZED` of them in `seconds`, until one
    fits: where the relaxation's least usages let its answer overflow, each next answer
    pays what the one before would, and moves off the copies that made it overflow."""
    answers, last = [], relaxed
    for _ in range(LINEARIZED):
        if not last.choices:
            break
        last = _truncated(solve(with_usage_nodes(around(problem, last.choices)),
                                time_limit=seconds / LINEARIZED, **options), problem)
        answers.append(last)
        if _best_fit(problem, [last]) is not None:
            break
    return answers


def _lower_limits(problem: ShardingProblem, relaxed_problem: ShardingProblem,
                  relaxed: Solution, seconds: float, options: dict) -> list[Solution]:
    """Answers of `relaxed_problem` under limits below `problem`'s, `LOWER_LIMITS` of them in
    `seconds`: the first lower by the overshoot of `relaxed` (its true peak over the
    limit), then, while none fits, lower by twice as much or by the last overshoot if more,
    and, once one fits or the relaxation cannot meet a limit, bisecting between the highest
    such limit and the lowest whose answer does not fit, until an answer repeats one
    before it."""
    limit = problem.usage_limit
    if limit is None or not relaxed.choices:
        return []
    floor, ceiling = None, limit  # a limit too low or whose answer fits; one it overshoots
    drop = problem.peak_usage(relaxed.choices) - limit
    below, answers = limit - drop, []
    for _ in range(LOWER_LIMITS):
        answer = _truncated(solve(dataclasses.replace(relaxed_problem, usage_limit=below),
                                  time_limit=seconds / LOWER_LIMITS, **options), problem)
        if answer.choices and any(answer.choices == a.choices for a in answers):
            break  # the limits between two that give one answer rarely give another
        answers.append(answer)
        if not answer.choices or problem.is_feasible(answer.choices):
            floor = below
            below = (below + ceiling) / 2
        else:
            ceiling = below
            drop = max(2 * drop, problem.peak_usage(answer.choices) - limit)
            below = (floor + below) / 2 if floor is not None else limit - drop
    return answers


def _given(problem: ShardingProblem, initial: tuple[int, ...] | None) -> Solution | None:
    """`initial` as an answer of `problem`, or None when there is none or it does not fit."""
    if initial is None or not problem.is_feasible(tuple(initial)):
        return None
    cost = problem.cost(tuple(initial))
    return Solution(tuple(initial), cost, -math.inf, "feasible", 0.0)


def _truncated(solution: Solution, problem: ShardingProblem) -> Solution:
    """`solution` of a problem with more nodes, restricted to `problem`'s, costed there."""
    choices = solution.choices[:problem.num_nodes]
    return dataclasses.replace(solution, choices=choices,
                               cost=problem.cost(choices) if choices else math.inf)


def _completed(expanded: ShardingProblem, answer: Solution | None) -> tuple[int, ...] | None:
    """`answer`'s choices, each usage node of `expanded` at the strategy its ends leave it
    (the one of finite cost), or None without an answer."""
    if answer is None:
        return None
    n = len(answer.choices)
    allowed = {u: np.ones(expanded.node_costs[u].size, dtype=bool)
               for u in range(n, expanded.num_nodes)}
    for (a, b), matrix in zip(expanded.edges, expanded.edge_costs):
        if b >= n > a:
            allowed[b] &= np.isfinite(matrix[answer.choices[a]])
        elif a >= n > b:
            allowed[a] &= np.isfinite(matrix[:, answer.choices[b]])
    return tuple(answer.choices) + tuple(int(np.argmax(mask)) for mask in allowed.values())


def _best_fit(problem: ShardingProblem, answers: list[Solution]) -> Solution | None:
    """The cheapest of `answers` that fits `problem` (edge usages included), or None."""
    fitting = [a for a in answers if a.choices and problem.is_feasible(a.choices)]
    return min(fitting, key=lambda a: a.cost, default=None)


def _search(flat: Flat, best: Best, seconds: float, *, left: Callable[[], float], seed: int,
            workers: int, repeatable: bool, report: Progress) -> Outcome:
    """Lagrangian warm start, then CP-SAT on the whole problem, or (larger problems) LNS
    on a work budget when `repeatable`, else guided search and LNS until the limit; a
    whole-problem search that ends unproven leaves its time to those."""
    budgets = PhaseBudgets.of(flat, seconds, repeatable=repeatable)
    tolerance = PLANNER_GAP if repeatable else 1e-9

    def open_gap() -> bool:
        return best.cost > report.bound + tolerance * abs(best.cost)

    hot, ran, prices = lagrangian(flat, best, iterations=budgets.lagrange_iterations,
                                  patience=budgets.patience, seed=seed,
                                  keep_going=lambda: left() > 0 and open_gap(),
                                  report=report)
    bound = -math.inf
    if budgets.exact:
        outcome = solve_whole(flat, best, hot, deterministic=budgets.deterministic(ran),
                              wall=left, seed=seed, workers=workers, report=report,
                              tolerance=tolerance)
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
            deterministic = linear.deterministic
        large_neighbourhoods(flat, best, deterministic=deterministic,
                             seed=seed, keep_going=lambda: left() > 0.5 and open_gap(),
                             wall=left, report=report)
    else:
        _alternate(flat, best, prices, seed=seed,
                   keep_going=lambda: left() > 0.5 and open_gap(), wall=left,
                   report=report)
    if best.x is None:
        return Outcome("unknown", bound)
    proved = best.cost <= report.bound + 1e-9 * abs(best.cost)
    return Outcome("optimal" if proved else "feasible", bound)


def _alternate(flat: Flat, best: Best, prices: np.ndarray, *, seed: int,
               keep_going: Callable[[], bool], wall: Callable[[], float],
               report: Progress) -> None:
    """Guided-search runs until `keep_going()` fails, alternately from the incumbent and
    from the Lagrangian's assignment; nothing runs while no assignment is known.

    A run ends once `GUIDED_PATIENCE` iterations in a row found nothing better than its
    own best. Each run after the first starts from the Lagrangian's prices times
    lognormal noise (sigma PRICE_NOISE, one factor per segment): restarted with the same
    prices the search returns to the same local optimum. Even a shaken restart from the
    incumbent mostly returns to its basin, and one trajectory stalls there however long
    it runs (IOPDDL's S: 0.964 and 0.958 points after 45 s and still after 180 s, two
    seeds), while trajectories from the Lagrangian's assignment end in different basins
    (0.958 to 0.967 over six seeds, 45 s each); so every other run starts there, and the
    runs from the incumbent refine the best basin found. On S this raised the score of
    three seeds from 0.9625, 0.9611 and (before the faster moves) 0.9589 to 0.964, 0.969
    and 0.975; on M it held 0.9974. A run that found nothing better hands a slice of
    LNS its incumbent: CP-SAT re-optimises regions exactly, which forest moves cannot on
    dense graphs.
    """
    rng = np.random.default_rng(seed)
    lagrangian_x = best.x
    shaken, cycle = prices, 0
    while best.x is not None and keep_going():
        before = best.cost
        guided_search(flat, best, shaken, iterations=10**9, patience=GUIDED_PATIENCE,
                      seed=seed + cycle, keep_going=keep_going, report=report,
                      start=lagrangian_x if cycle % 2 else best.x)
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


def _memory_weighted(problem: ShardingProblem) -> ShardingProblem:
    """The same problem costed by the memory each choice holds over time (its usage times
    the time steps it is live, an edge usage's on an edge of its own; forbidden choices
    stay forbidden): its cheapest answers hold the least memory, which is what an answer
    that fits needs, where zero costs leave the search no direction."""
    def held(usage: np.ndarray, interval: tuple[int, int]) -> np.ndarray:
        return np.maximum(usage, 0.0) * max(interval[1] - interval[0], 0)

    return dataclasses.replace(
        problem,
        node_costs=tuple(np.where(np.isfinite(c), held(u, span), np.inf) for c, u, span
                         in zip(problem.node_costs, problem.node_usages, problem.intervals)),
        edges=problem.edges + tuple(u.nodes for u in problem.edge_usages),
        edge_costs=tuple(np.where(np.isfinite(m), 0.0, np.inf) for m in problem.edge_costs)
        + tuple(held(u.usages, u.interval) for u in problem.edge_usages))


def _cost_free(problem: ShardingProblem, limit: float | None) -> ShardingProblem:
    """The same problem with every finite cost zero (forbidden choices stay forbidden)."""
    return dataclasses.replace(
        problem, usage_limit=limit,
        node_costs=tuple(np.where(np.isfinite(c), 0.0, np.inf) for c in problem.node_costs),
        edge_costs=tuple(np.where(np.isfinite(m), 0.0, np.inf) for m in problem.edge_costs))


def min_peak_usage(problem: ShardingProblem, *, time_limit: float = 10.0) -> float:
    """Least peak usage of any finite-cost assignment (costs ignored); inf if none exists.

    Bisection on the limit, each step a feasibility solve. When time runs out before the
    bisection closes, the result is the smallest peak actually achieved (an upper bound).
    """
    _check_args(time_limit, 1)
    start = time.monotonic()
    free = _cost_free(problem, None)
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
        trial = solve(_cost_free(problem, mid), time_limit=max(min(left, time_limit / 4), 0.05),
                      workers=1, repeatable=True)
        if trial.choices:
            hi = problem.peak_usage(trial.choices)
        elif trial.status == "infeasible":
            lo = mid + 1 if integral else mid
        else:
            break
    return float(hi)
