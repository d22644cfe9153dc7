"""Timings of a profile: batches of calls long enough to span the scheduler's slices, and
a robust central figure over the batches.

Each sample of a `Timing` is the mean time of one call over a batch of calls (a kernel's
lasting at least `MIN_TIMING_S`, a collective's `links.BATCH_S`): within a batch, the long
tail of single calls (a peer woken late by the scheduler, a slice lost to another rank)
is averaged in, as a step pays it. Whole batches are sometimes disturbed (another process
takes a core for a while, the ranks' placement on the cores changes); the figure of a
timing is the interquartile mean of its samples (`Timing.typical`), which keeps their
middle half and so neither follows one disturbed batch nor jumps between two modes as a
median of a few does.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def interquartile_mean(values: Sequence[float]) -> float:
    """The mean of the middle half of `values`: sorted, with floor(n / 4) dropped at each
    end (all of them for n < 4)."""
    ordered = sorted(values)
    cut = len(ordered) // 4
    return statistics.fmean(ordered[cut:len(ordered) - cut])


@dataclass(frozen=True)
class Timing:
    """Some timings (seconds, each one call's mean over a batch): their median, spread
    (q3 - q1) / median, mean, and interquartile mean `typical`, the figure a profile fits
    (see the module docstring)."""

    median: float
    spread: float
    mean: float
    typical: float
    samples: tuple[float, ...]

    @staticmethod
    def of(seconds: Sequence[float]) -> Timing:
        ordered = sorted(seconds)
        q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
        median = statistics.median(ordered)
        return Timing(median, (q3 - q1) / median if median else 0.0, statistics.fmean(ordered),
                      interquartile_mean(ordered), tuple(seconds))

    def per(self, count: int) -> Timing:
        """The timing of one of `count` equal parts."""
        return Timing.of([t / count for t in self.samples])


# The least time one timing covers. Ranks that share cores take turns on them in time
# slices of the scheduler (several ms): a timing shorter than a few slices can run whole
# while the other ranks wait their turn, and would measure a rank alone. One that spans
# many measures each rank's share of the cores, as a step gets it.
MIN_TIMING_S = 0.1


def calls_lasting(run: Callable[[], object], seconds: float, *,
                  sync: Callable[[], object] = lambda: None) -> int:
    """How many consecutive calls of `run` last at least `seconds`: batches of 1, 2, 4, ...
    calls until one lasts a quarter of `seconds`, then its count scaled to `seconds`,
    ceil(count x seconds / elapsed). A batch, not one call, sets the count: a single call
    fits in one scheduler slice and runs at a core's full speed, and a count set by it
    would make batches shorter than `seconds` on cores shared by the ranks."""
    count = 1
    while True:
        sync()
        start = time.perf_counter()
        for _ in range(count):
            run()
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds / 4:
            return max(1, math.ceil(count * seconds / elapsed))
        count *= 2


def timed(run: Callable[[], object], repeats: int, *,
          sync: Callable[[], object] = lambda: None,
          align: Callable[[], object] = lambda: None,
          agree: Callable[[int], int] = lambda count: count) -> Timing:
    """`run` timed `repeats` times after an untimed call (allocation and first dispatch);
    each timing covers the same count of calls, enough to last `MIN_TIMING_S`
    (`calls_lasting`), and is divided by it.
    `sync` waits for the device's queued work (`torch.cuda.synchronize` on a GPU), before
    each timing starts and before it ends; `align` (a barrier of the ranks) starts every
    timing at once on every rank, so that the ranks' k-th timings ran side by side, and
    follows the last, so that no rank's next work (making the inputs of its next kernel)
    runs beside another rank's last timing; `agree` turns each rank's count into one for
    all (the largest), so that the ranks' timings also run side by side to their end: a
    rank done early leaves the cores to the others, which then run faster than in a step."""
    return _alternated((run,), repeats, sync, align, agree)[0]


def timed_pair(run: Callable[[], object], other: Callable[[], object], repeats: int, *,
               sync: Callable[[], object] = lambda: None,
               align: Callable[[], object] = lambda: None,
               agree: Callable[[int], int] = lambda count: count) -> tuple[Timing, Timing]:
    """`run` and `other` timed as `timed` times one, in alternation (a timing of one, then
    of the other, `repeats` times), so that a difference of the two (a kernel's launch
    beyond a bare dispatch) is taken between timings that found the cores in the same
    state: the load beside the ranks changes over seconds, and two timings taken far
    apart can differ by more than the difference."""
    first, second = _alternated((run, other), repeats, sync, align, agree)
    return first, second


def _alternated(runs: Sequence[Callable[[], object]], repeats: int, sync, align, agree
                ) -> list[Timing]:
    """The timings of `runs` (see `timed`), each repeat timing each run in turn."""
    counts = []
    for run in runs:
        run()
        counts.append(agree(calls_lasting(run, MIN_TIMING_S, sync=sync)))
    seconds: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, count, timings in zip(runs, counts, seconds):
            align()
            sync()
            start = time.perf_counter()
            for _ in range(count):
                run()
            sync()
            timings.append((time.perf_counter() - start) / count)
    align()
    return [Timing.of(timings) for timings in seconds]


def spread_of(timings: Sequence[Timing]) -> float:
    """The noise of the ranks' timings of one figure: the larger of the relative range of
    their medians, (max - min) / median of them, and of each one's spread."""
    medians = [t.median for t in timings]
    value = statistics.median(medians)
    across = (max(medians) - min(medians)) / value if value else 0.0
    return max(across, max(t.spread for t in timings))


def combined(timings: Sequence[Timing]) -> Timing:
    """One figure from the ranks' timings, as a step of all of them sees it: the ranks'
    k-th timings ran side by side (`timed`'s `align`), and a step waits for the slowest
    rank, so each sample is the slowest rank's k-th timing. Its spread is `spread_of` the
    ranks' timings."""
    slowest = Timing.of([max(ts) for ts in zip(*(t.samples for t in timings))])
    return Timing(slowest.median, spread_of(timings), slowest.mean, slowest.typical,
                  slowest.samples)


def pooled(timings: Sequence[Timing]) -> Timing:
    """One figure from the ranks' timings of a collective: every rank's samples together.
    A collective's ranks wait for each other, so each rank's timing is its group's, and
    the groups of an axis time the same collective at once: every sample measures the
    same figure. Its spread is `spread_of` the ranks' timings."""
    every = Timing.of([t for timing in timings for t in timing.samples])
    return Timing(every.median, spread_of(timings), every.mean, every.typical, every.samples)
