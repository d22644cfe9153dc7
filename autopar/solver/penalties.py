"""Penalty search: memory as a price per term, found by bisection, the priced problems
solved by toulbar2 in parallel, their answers crossed into the incumbent.

Every usage term (a node's bytes over a range of segments) pays its own price per byte.
Each round solves `LEVELS` priced problems (`wcsp.Wcsp`), level j pricing every term at

    lo_t + (j + 1) / LEVELS * (hi_t - lo_t),

in forked children, `workers` at a time. A term whose range overflows in an answer was
priced too low there. So each term's bracket narrows to [the highest level it overflowed
at below its first level within the limit, that level]; a term within the limit at every
level sees its lower end shrink (`SHRINK`), one over it at every level its upper end
grow (`GROW`). The first round prices every term alike, on a ladder of factors
`LADDER ** (j - 1)` times the incumbent's cost per byte, to find the brackets' scale.

A price per term is finer than a price per segment (the Lagrangian's, the guided
search's): two nodes live over the same segments may pay differently, which is what an
answer near the limit needs when few of its tensors decide whether it fits. Each answer
is repaired to fit, descended and offered; then the incumbent is crossed with it, even
one that overflows (`crossover.crossed` takes only pieces that keep it within the
limit), and with the recent ones. On IOPDDL's S, whose priced answers come within 0.5%
of the contest's best cost at 1 to 1.5% over the limit, the crossings reached 1.542e9
(0.995 points) after 190 s on 2 workers, where the guided search's restarts end between
0.972 and 0.987 at 240 s; the guided search from that incumbent then (`solve`) took it
to 1.533e9 and 1.531e9 in two runs, below the contest's best.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import multiprocessing.connection
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from autopar.solver.crossover import CROSSED_OPTIMA, crossed
from autopar.solver.flat import Flat
from autopar.solver.lagrange import Best
from autopar.solver.progress import Progress
from autopar.solver.repair import MemoryMoves
from autopar.solver.wcsp import Wcsp, toulbar2_available

# Priced problems per round: the bisection's resolution per round (IOPDDL's S: 4 levels
# on 2 workers, a round every 9 s).
LEVELS = 4
# The first round's ladder of price factors, and how the bracket of a term that never
# (always) overflowed moves down (up) per round.
LADDER = 4.0
SHRINK, GROW = 1.5, 1.35
# Rounds the time limit should allow: toulbar2's seconds per answer follow from it,
# within [1, MAX_SECONDS] (S's answers improve little after 6 s).
ROUNDS = 15
MAX_SECONDS = 8


@dataclass(frozen=True)
class Brackets:
    """Each term's price bracket [lo, hi] per byte."""

    lo: np.ndarray
    hi: np.ndarray

    def levels(self) -> np.ndarray:
        """The round's prices: `LEVELS` rows, one price per term each."""
        steps = (np.arange(LEVELS)[:, None] + 1.0) / LEVELS
        return self.lo[None, :] + steps * (self.hi - self.lo)[None, :]

    def narrowed(self, prices: np.ndarray, broken: np.ndarray) -> Brackets:
        """The brackets after a round priced the terms at `prices` (rows of levels, in
        increasing order) and found them over the limit where `broken`."""
        rows = np.arange(len(prices))[:, None]
        within = ~broken
        first_ok = np.where(within.any(axis=0), within.argmax(axis=0), len(prices))
        below = broken & (rows < first_ok[None, :])
        columns = np.arange(prices.shape[1])
        last_below = np.where(below, rows, -1).max(axis=0)
        hi = np.where(first_ok < len(prices),
                      prices[np.minimum(first_ok, len(prices) - 1), columns], self.hi * GROW)
        lo = np.where(last_below >= 0, prices[np.maximum(last_below, 0), columns],
                      self.lo / SHRINK)
        return Brackets(np.minimum(lo, hi), hi)


def ladder(flat: Flat, x: np.ndarray) -> np.ndarray:
    """The first round's prices: the cost per byte of `x` (its objective over its terms'
    summed usage) times `LADDER ** (j - 1)` for level j, the same for every term."""
    used = float(flat.term_values(x).sum())
    scale = abs(flat.objective(x)) / used if used > 0 else 1.0
    factors = LADDER ** (np.arange(LEVELS) - 1.0)
    return np.repeat((scale * factors)[:, None], flat.term_node.size, axis=1)


def broken_terms(flat: Flat, x: np.ndarray) -> np.ndarray:
    """Which terms have a segment of their range over the limit under `x`."""
    over = np.concatenate([[0], np.cumsum(flat.profile(x) > flat.limit)])
    return over[flat.term_hi] > over[flat.term_lo]


def penalties_apply(flat: Flat) -> bool:
    """Whether the penalty search can run on `flat`: toulbar2 imports and a memory limit
    binds somewhere (the reductions drop the segments that can never exceed it)."""
    return bool(np.isfinite(flat.limit) and flat.problem.base.size and toulbar2_available())


def penalty_search(flat: Flat, best: Best, *, workers: int, seed: int,
                   keep_going: Callable[[], bool], wall: Callable[[], float],
                   report: Progress) -> None:
    """Rounds of priced answers (module docstring) while `keep_going()` and a round's
    answers can come before `wall()` (seconds left) runs out; improves `best`, which must
    hold an assignment that fits."""
    wcsp = Wcsp(flat)
    moves, rng = MemoryMoves(flat), np.random.default_rng(seed)
    seconds = int(min(max(wall() / (ROUNDS * -(-LEVELS // workers)), 1), MAX_SECONDS))
    prices, brackets, recent = ladder(flat, best.x), None, []
    for round_ in itertools.count():
        if not keep_going() or wall() < seconds + 1:
            return
        broken = np.zeros(prices.shape, dtype=bool)
        answered = np.zeros(len(prices), dtype=bool)
        solves = [functools.partial(wcsp.answer, flat.priced_terms(p), seconds=seconds,
                                    seed=seed + j) for j, p in enumerate(prices)]
        for j, x in in_children(solves, workers=workers, seconds=wall):
            if x is None:
                continue
            answered[j], broken[j] = True, broken_terms(flat, x)
            fitted = moves.fitted(x, not broken[j].any(), rng)
            gained = best.offer(flat, fitted)
            for donor in [x, *([] if fitted is None else [fitted]), *recent]:
                gained |= best.offer(flat, crossed(flat, moves, best.x, donor))
            recent = [x, *recent][:CROSSED_OPTIMA]
            (report if gained else report.tick)(f"penalty round {round_} level {j}")
        if answered.any():
            brackets = (brackets or Brackets(prices[0] / LADDER, prices[-1])).narrowed(
                prices[answered], broken[answered])
        prices = brackets.levels() if brackets is not None else prices


def in_children(tasks: list[Callable[[], object]], *, workers: int,
                seconds: Callable[[], float]) -> Iterator[tuple[int, object]]:
    """(index, result) of each task as it finishes, each run in a forked child, at most
    `workers` at once (None for one that failed); once `seconds()` (left) runs out,
    the children still running are stopped and nothing more is yielded. Forked, the children share
    the parent's memory: nothing is pickled but their results."""
    context = multiprocessing.get_context("fork")
    pending, running = list(enumerate(tasks)), {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                index, task = pending.pop(0)
                receive, send = context.Pipe(duplex=False)
                child = context.Process(target=_run, args=(task, send), daemon=True)
                child.start()
                send.close()
                running[receive] = (index, child)
            ready = multiprocessing.connection.wait(list(running), max(seconds(), 0.0))
            if not ready:
                return
            for receive in ready:
                index, child = running.pop(receive)
                try:
                    result = receive.recv()
                except EOFError:  # the child died before sending
                    result = None
                child.join()
                yield index, result
    finally:
        for _, child in running.values():
            child.terminate()
            child.join()


def _run(task: Callable[[], object], send: multiprocessing.connection.Connection) -> None:
    try:
        result = task()
    except Exception:  # e.g. toulbar2 proving the priced problem has no finite answer
        result = None
    send.send(result)
    send.close()
