"""Answers of a problem with a usage limit from solves without one, its memory priced.

The limit couples every node live at a time step. Pricing it instead (the Lagrangian
relaxation of the limit) leaves a problem without one (`priced`): each strategy of a node
pays its usage times the summed price of the steps it is live at, each edge usage the same
on an edge of its ends, exactly, so an answer's priced cost is its cost plus its usage
weighted by the prices. Such a problem reduces and solves like an unconstrained one, and
its answer trades time for memory across the whole graph at once, where the repair's moves
of one tied group at a time (`fit_repair`) stop far from that.

`priced_answers` searches one price per byte on the steps where an answer so far exceeded
the limit (the start's first). The first is the price at which the limit's bytes at every
such step cost `FIRST_PRICE` of the start's cost; it is multiplied by `RAISE` while the
answers overflow (divided while they fit) until one of each is found, then bisected
geometrically between the highest price whose answer overflowed and the lowest whose
answer fits, until the two are within `CLOSED` of each other, `PRICED_SOLVES` solves at
most; raising ends once `STALLED` raises lowered no answer's peak (`_stalled`). Every
distinct answer is returned. A price is a multiplier, not an answer: the
answers jump between a few points as it moves, so this brackets the cheapest answer that
fits in that family, not the problem's optimum; the overflowing answers near it are the
repair's to finish.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from autopar.solver.problem import ShardingProblem
from autopar.solver.solution import Solution

FIRST_PRICE = 0.1
RAISE = 4.0
PRICED_SOLVES = 8
CLOSED = 1.1
SAFETY = 4.0
STALLED = 2


def priced(problem: ShardingProblem, prices: np.ndarray, start: int) -> ShardingProblem:
    """`problem` without its usage limit, each usage paying `prices[t - start]` per unit at
    every step t it is live at (steps outside the prices pay nothing): node usages on their
    node's costs, edge usages on an edge of their ends (one per pair of ends, their priced
    usages summed; none where they pay nothing)."""
    summed = np.concatenate([[0.0], np.cumsum(prices)])

    def weight(interval: tuple[int, int]) -> float:
        lo, hi = (min(max(t - start, 0), prices.size) for t in interval)
        return float(summed[hi] - summed[lo]) if hi > lo else 0.0

    paid: dict[tuple[int, int], np.ndarray] = {}
    for u in problem.edge_usages:
        if (w := weight(u.interval)) != 0.0:
            paid[u.nodes] = paid[u.nodes] + w * u.usages if u.nodes in paid else w * u.usages
    return dataclasses.replace(
        problem, usage_limit=None, edge_usages=(),
        node_costs=tuple(np.where(np.isfinite(c), c + weight(span) * u, np.inf)
                         for c, u, span in zip(problem.node_costs, problem.node_usages,
                                               problem.intervals)),
        edges=problem.edges + tuple(paid), edge_costs=problem.edge_costs + tuple(paid.values()))


def memory_free(problem: ShardingProblem, seconds: float,
                run: Callable[..., Solution]) -> Solution:
    """The answer of `problem` without its usage limit (`run` within `seconds`), costed in
    `problem` (an answer of it where it fits); its bound holds for `problem` too."""
    return _costed(run(priced(problem, np.zeros(0), 0), time_limit=seconds), problem,
                   keep_bound=True)


def priced_answers(problem: ShardingProblem, start: Solution, seconds: float,
                   run: Callable[..., Solution], *, each: float = 0.5) -> list[Solution]:
    """Distinct answers of `problem` (which has a usage limit) from `run`s of it priced
    (module docstring), beginning at the overflowing answer `start`, within `seconds`,
    each solve within `each` of them (a screening's `1 / PRICED_SOLVES`: its answers only
    compare candidates)."""
    began, limit = time.monotonic(), problem.usage_limit
    if limit is None or limit <= 0 or not start.choices or not 0 < start.cost < math.inf:
        return []
    over = problem.usage_profile(start.choices) > limit
    if not over.any():
        return []
    price = FIRST_PRICE * start.cost / (limit * over.sum())
    first = problem.profile_start  # the step `over` starts at
    low, high = 0.0, math.inf  # the highest price that overflowed, the lowest that fit
    answers: list[Solution] = []
    peaks: list[float] = []  # of the answers while the price is raised
    for _ in range(PRICED_SOLVES):
        # Each solve may take `each` of the time (half, unless screening), and the loop
        # ends on its own counts, not on the clock, which only caps it (at SAFETY times
        # the time): the solves end early (a priced problem reduces like an unconstrained
        # one), and the answers stay the same on any machine that is not much slower.
        if high <= CLOSED * low or time.monotonic() - began > SAFETY * seconds \
                or _stalled(peaks):
            break
        answer = _costed(run(priced(problem, price * over, first),
                             time_limit=each * seconds), problem)
        if not answer.choices:
            break
        if all(answer.choices != a.choices for a in answers):
            answers.append(answer)
        profile = problem.usage_profile(answer.choices)
        if (peak := float(profile.max())) <= limit:
            high = price
        else:
            low, over = price, over | (profile > limit)
            peaks += [peak] if math.isinf(high) else []
        price = (price * RAISE if math.isinf(high) else price / RAISE if low == 0
                 else math.sqrt(low * high))
    return answers


def _stalled(peaks: list[float]) -> bool:
    """Whether the last `STALLED` raises of the price lowered the peak of none of their
    answers: the least memory the priced answers reach overflows (on the 405B shape's
    stage problems without a fit, the peak held from the fifth of eight solves on, while
    the others' fell at every raise until one fit)."""
    return len(peaks) > STALLED and min(peaks[-STALLED:]) >= peaks[-STALLED - 1]


def _costed(answer: Solution, problem: ShardingProblem, *, keep_bound: bool = False
            ) -> Solution:
    """`answer` of a priced `problem` as an answer of `problem` itself; its bound kept only
    where no price was charged (`keep_bound`: a lower bound of the problem without its
    limit, so of `problem` too), and with it "optimal" where its cost meets it."""
    if not answer.choices:
        return answer
    cost, bound = problem.cost(answer.choices), answer.bound if keep_bound else -math.inf
    status = "optimal" if cost <= bound + 1e-9 * abs(cost) else "feasible"
    return dataclasses.replace(answer, cost=cost, status=status, bound=bound)
