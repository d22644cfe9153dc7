"""The solve of a problem with edge usages (`edge_usage.py`'s docstring), in phases, each
with its share of the time limit (`EDGE_USAGE_SHARES`; only the bounds of the memory-free,
relaxed and exact solves hold):

0. where every assignment overflows (`usage_floor`, in milliseconds), none: infeasible;
1. without its limit (`memory_free`, `FREE_SHARE` of the relaxation's time): the answer
   where it fits and is optimal; its cost is the solution's `memory_free`;
2. for a caller screening many candidates, the memory priced and the overflowing answers
   repaired (`_screened`): the cheapest that fits is the answer, and where none fits,
   phases 3 and 4 end the screening (5 and 6 only with `fallback`: on the 405B shape's
   planning and on 218 random problems, they never found a fit that 3 and 4 missed);
3. with each edge usage at its least over its first end (`edge_usage.relaxation`): its
   answer is the problem's when it fits;
4. with the usages as that answer pays them (`_linearized`), then the memory priced instead
   of limited (`memory_prices`) and the cheaper answers that overflow repaired until they
   fit (`fit_repair`), unless done in 2;
5. while none fits, the relaxation under lower limits (`_lower_limits`);
6. exactly (`_exact`, when its expansion is small enough: `REFINE_SHARE` of that after an
   answer that fits), started from the cheapest answer that fits, or, when none does, any
   answer that fits, costs aside (`_any_fit`).

Each phase's problems are plain ones, solved by the `solve` it is given
(`autopar.solver.solve`'s, which calls this module for a problem with edge usages)."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable

import numpy as np

from autopar.solver.edge_usage import (
    around,
    expansion_cells,
    relaxation,
    usage_floor,
    with_usage_nodes,
)
from autopar.solver.fit_repair import repair_to_fit
from autopar.solver.memory_prices import PRICED_SOLVES, memory_free, priced_answers
from autopar.solver.problem import ShardingProblem
from autopar.solver.progress import Progress
from autopar.solver.solution import Solution

# Solves of a problem with edge usages (`solve_with_edge_usages`): the relaxation at the limit,
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
# The problem without its limit is solved first, with this share of the relaxation's time
# (it reduces like an unconstrained problem: a tenth of a second on the Llama shapes'):
# where its answer fits and is optimal it is the answer, and its cost is reported
# (`Solution.memory_free`).
FREE_SHARE = 0.5
# This share of the lower limits' time searches the problem with its memory priced
# instead of limited (`memory_prices`), unless an answer so far fits within PRICED_GAP of
# the best bound known (the relaxation's, the memory-free answer's): it has little left to
# find then. On the 405B shape's pipeline stages (370 nodes, 1,828 edge usages) it found
# answers that fit at 45 to 76 s a step where the phases before found 64 to 116 s, and
# answers where they found none.
PRICED_SHARE = 0.5
PRICED_GAP = 0.01
# The answers that overflow and are cheaper than the best that fits are repaired in the true
# problem (`fit_repair`) within this share of what is left, before the lower limits run.
REPAIR_SHARE = 0.5
# When none of the relaxation's answers fits, this share of the exact phase's looks for any
# answer that fits, costs aside, for the exact solve to start from; where none is found
# and the caller has nothing else to try (`fallback`), this share of the rest looks for
# one by the memory each choice holds. Only then: the exact search stays near the answer
# it starts from, and the one that holds the least is far from cheap (a 126-layer Llama's
# pipeline stages over 8x8x8 fit at 5 to 7 times their relaxation's cost, so that the
# search for more micro-batches, which fit at a fifth of that, stopped at 64).
FIT_SHARE = 0.25
# The exact expansion is solved only when reducing it (about REDUCE_SECONDS_PER_CELL a cell
# of its cost matrices, on 2 cores) takes at most EXPANSION_SHARE of the exact phase: the
# usage nodes of a model with hundreds of strategies per op can hold hundreds of millions
# of cells, seconds to minutes before any search.
REDUCE_SECONDS_PER_CELL = 4e-8
EXPANSION_SHARE = 0.5
# No answer (`_done` gives it the solve's bound), and the proof that none exists.
NO_ANSWER = Solution((), math.inf, -math.inf, "unknown", 0.0)
INFEASIBLE = dataclasses.replace(NO_ANSWER, status="infeasible")


def solve_with_edge_usages(problem: ShardingProblem, solve: Callable[..., Solution], *,
                           time_limit: float, seed: int, workers: int,
                           progress: Callable[[str], None] | None, repeatable: bool,
                           any_fit: bool = True, fallback: bool = False,
                           initial: tuple[int, ...] | None = None,
                           reference: tuple[int, ...] | None = None,
                           screening: bool = False) -> Solution:
    """`solve` of a problem with edge usages in phases (module docstring), each phase's
    problems solved by `solve` (the other arguments are its). An `initial` assignment that
    fits is an answer like the others; a `reference` that fits is the relaxation's to end
    on (`solve`'s `reference`); `any_fit`: whether phase 6 looks for any answer that fits
    when none does; `screening`: whether phase 2 runs (the others then only when it finds
    no answer that fits, phases 5 and 6 only with `fallback`)."""
    start, shares = time.monotonic(), [share * time_limit for share in EDGE_USAGE_SHARES]
    if (unfit := _over_floor(problem, progress, start)) is not None:
        return unfit
    options = dict(seed=seed, workers=workers, progress=progress, repeatable=repeatable)
    run = functools.partial(solve, **options)
    given = _given(problem, initial)
    free = memory_free(problem, FREE_SHARE * shares[0], run) \
        if problem.usage_limit is not None else NO_ANSWER
    if free.status == "optimal" and _best_fit(problem, [free]) is not None:
        return _done(free, free.bound, free, start)
    quick = _screened(problem, free, shares[2], run) if screening else []
    if (fitting := _best_fit(problem, quick)) is not None:
        return _done(fitting, free.bound, free, start)
    relaxed_problem = with_usage_nodes(relaxation(problem))
    referred = _given(problem, reference)
    relaxed = _truncated(run(relaxed_problem, time_limit=shares[0],
                             reference=_completed(relaxed_problem, referred)), problem)
    if relaxed.status == "infeasible":
        return _done(relaxed, relaxed.bound, free, start)
    if _best_fit(problem, [relaxed]) is not None:
        # An answer of the relaxation that fits is one of the problem's at the same cost,
        # and the relaxation's optimum bounds the problem's: the exact search (larger, its
        # moves blocked by the usage nodes' ties) would start from it and rarely do better.
        return _done(_best_fit(problem, [relaxed, free]), max(relaxed.bound, free.bound),
                     free, start)
    answers = [relaxed, *([free] if free.choices else []), *quick]
    answers += _linearized(problem, relaxed, shares[1], run)
    if not screening:  # else done by `_screened`
        answers += _priced_and_repaired(problem, answers, relaxed, free, shares[2], run)
    shares[2] *= (1 - PRICED_SHARE) * (1 - REPAIR_SHARE)
    fitting = _best_fit(problem, answers)
    if screening and not fallback:
        return _done(fitting or NO_ANSWER, max(relaxed.bound, free.bound), free, start)
    refining = fitting is not None
    if not refining:
        answers += _lower_limits(problem, relaxed_problem, relaxed, shares[2], run)
    answers += [given] if given else []
    if any_fit:
        found, shares[3] = _any_fit(problem, answers, solve, shares[3], fallback, options)
        answers += found
    exact = _exact(problem, _best_fit(problem, answers), shares[3], run,
                   EXPANSION_SHARE * (REFINE_SHARE if refining else 1.0))
    best = _best_fit(problem, [*answers, exact]) or (
        INFEASIBLE if exact.status == "infeasible" else NO_ANSWER)
    return _done(best, max(relaxed.bound, exact.bound, free.bound), free, start)


def _over_floor(problem: ShardingProblem, progress: Callable[[str], None] | None,
                start: float) -> Solution | None:
    """The infeasible answer where every assignment overflows (`usage_floor`: proven at
    once, where the phases would search), else None; the tolerance is the reductions'."""
    limit = problem.usage_limit
    if limit is None or (floor := usage_floor(problem)) <= limit + 1e-9 * abs(limit):
        return None
    Progress(progress, started=start)(f"infeasible: every assignment uses at least "
                                      f"{floor:.6g}, over the limit {limit:.6g}")
    return _done(INFEASIBLE, math.inf, NO_ANSWER, start)


def _screened(problem: ShardingProblem, free: Solution, seconds: float,
              run: Callable[..., Solution]) -> list[Solution]:
    """The answers of `problem` with its memory priced from the memory-free answer `free`
    and the overflowing ones repaired (with the shares of `seconds` `_priced_and_repaired`
    gives them; each priced solve an even share). On 16 of the 405B shape's stage problems
    their cheapest that fits was the full solve's answer on 9 and 2 to 6% dearer on 7, in
    30% of the time: enough to compare candidates, whose chosen one is planned in full."""
    if not free.choices:
        return []
    answers = priced_answers(problem, free, PRICED_SHARE * seconds, run,
                             each=1 / PRICED_SOLVES)
    return answers + _repaired(problem, [free, *answers],
                               REPAIR_SHARE * (1 - PRICED_SHARE) * seconds)


def _any_fit(problem: ShardingProblem, answers: list[Solution], solve: Callable[..., Solution],
             seconds: float, fallback: bool, options: dict) -> tuple[list[Solution], float]:
    """While none of `answers` fits, an answer that fits costs aside (`cost_free`, then with
    `fallback` `_memory_weighted`), each search `FIT_SHARE` of what is left of `seconds`:
    the answers found, and the seconds left."""
    found: list[Solution] = []
    searches = (cost_free(problem, problem.usage_limit),) + (
        (_memory_weighted(problem),) if fallback else ())
    for unpriced in searches:
        if _best_fit(problem, answers + found) is not None:
            break
        result = solve_with_edge_usages(unpriced, solve, time_limit=seconds * FIT_SHARE,
                                        any_fit=False, **options)
        found.append(_truncated(result, problem))
        seconds *= 1 - FIT_SHARE
    return found, seconds


def _done(best: Solution, bound: float, free: Solution, start: float) -> Solution:
    """`best` as the solve's answer: under `bound` (capped at its cost; "optimal" when it
    meets it), with the memory-free answer's cost, timed from `start`."""
    bound = min(bound, best.cost) if best.choices else bound
    status = best.status if not best.choices else (
        "optimal" if best.cost <= bound + 1e-9 * abs(best.cost) else "feasible")
    return dataclasses.replace(best, bound=bound, status=status, memory_free=_cost(free),
                               wall_time=time.monotonic() - start)


def _cost(answer: Solution) -> float | None:
    return answer.cost if answer.choices else None


def _priced_and_repaired(problem: ShardingProblem, answers: list[Solution],
                         relaxed: Solution, free: Solution, seconds: float,
                         run: Callable[..., Solution]) -> list[Solution]:
    """The answers of `problem` with its memory priced (`PRICED_SHARE` of `seconds`, unless
    one of `answers` fits within `PRICED_GAP` of the bounds of `relaxed` and `free`), then
    the overflowing ones cheaper than any that fits repaired (`REPAIR_SHARE` of the rest)."""
    fitting = _best_fit(problem, answers)
    found = []
    if fitting is None or fitting.cost > (1 + PRICED_GAP) * max(relaxed.bound, free.bound):
        found = priced_answers(problem, relaxed if relaxed.choices else free,
                               PRICED_SHARE * seconds, run)
    return found + _repaired(problem, answers + found,
                             REPAIR_SHARE * (1 - PRICED_SHARE) * seconds)


def _repaired(problem: ShardingProblem, answers: list[Solution],
              seconds: float) -> list[Solution]:
    """The `answers` that overflow and are cheaper than the cheapest that fits, cheapest
    first, each repaired in `problem` until it fits (`fit_repair.repair_to_fit`) within
    what is left of `seconds`: the fitting ones, as answers."""
    began = time.monotonic()
    fitting = _best_fit(problem, answers)
    best = fitting.cost if fitting is not None else math.inf
    repaired = []
    for answer in sorted(answers, key=lambda a: a.cost):
        left = seconds - (time.monotonic() - began)
        if answer.cost >= best or left <= 0:
            break
        if not answer.choices or problem.is_feasible(answer.choices):
            continue
        at = time.monotonic()
        fitted = repair_to_fit(problem, answer.choices, seconds=left)
        if fitted is not None:
            repaired.append(Solution(fitted, problem.cost(fitted), -math.inf, "feasible",
                                     time.monotonic() - at))
            best = min(best, repaired[-1].cost)
    return repaired


def _exact(problem: ShardingProblem, start: Solution | None, seconds: float,
           run: Callable[..., Solution], expansion_share: float = EXPANSION_SHARE
           ) -> Solution:
    """`problem` solved with its edge usages as nodes (`with_usage_nodes`) from `start`, in
    `seconds`, restricted to its own nodes; no answer when that expansion is too large to
    reduce in `expansion_share` of `seconds`."""
    if expansion_cells(problem) * REDUCE_SECONDS_PER_CELL > expansion_share * seconds:
        return Solution((), math.inf, -math.inf, "unknown", 0.0)
    expanded = with_usage_nodes(problem)
    exact = run(expanded, time_limit=seconds, initial=_completed(expanded, start))
    return _truncated(exact, problem)


def _linearized(problem: ShardingProblem, relaxed: Solution, seconds: float,
                run: Callable[..., Solution]) -> list[Solution]:
    """Answers of `problem` with its edge usages around the answer before
    (`edge_usage.around`, first `relaxed`'s), `LINEARIZED` of them in `seconds`, until one
    fits: where the relaxation's least usages let its answer overflow, each next answer
    pays what the one before would, and moves off the copies that made it overflow."""
    answers, last = [], relaxed
    for _ in range(LINEARIZED):
        if not last.choices:
            break
        last = _truncated(run(with_usage_nodes(around(problem, last.choices)),
                              time_limit=seconds / LINEARIZED), problem)
        answers.append(last)
        if _best_fit(problem, [last]) is not None:
            break
    return answers


def _lower_limits(problem: ShardingProblem, relaxed_problem: ShardingProblem,
                  relaxed: Solution, seconds: float,
                  run: Callable[..., Solution]) -> list[Solution]:
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
        answer = _truncated(run(dataclasses.replace(relaxed_problem, usage_limit=below),
                                time_limit=seconds / LOWER_LIMITS), problem)
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


def cost_free(problem: ShardingProblem, limit: float | None) -> ShardingProblem:
    """The same problem under `limit` with every finite cost zero (forbidden choices stay
    forbidden)."""
    return dataclasses.replace(
        problem, usage_limit=limit,
        node_costs=tuple(np.where(np.isfinite(c), 0.0, np.inf) for c in problem.node_costs),
        edge_costs=tuple(np.where(np.isfinite(m), 0.0, np.inf) for m in problem.edge_costs))


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
