"""Timings of a profile: the median of repeated runs, and how much they spread."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Some timings (seconds): their mean, median and spread, (q3 - q1) / median.

    Figures are fitted to means: a step's time is the sum of its ops', so its expectation
    is the sum of their means, and an op whose times have a long tail (a collective whose
    peer is woken late by the scheduler) costs its mean, not its median."""

    median: float
    spread: float
    mean: float
    samples: tuple[float, ...] = ()

    @staticmethod
    def of(seconds: Sequence[float]) -> Timing:
        ordered = sorted(seconds)
        q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
        median = statistics.median(ordered)
        return Timing(median, (q3 - q1) / median if median else 0.0, statistics.fmean(ordered),
                      tuple(seconds))

    def per(self, count: int) -> Timing:
        """The timing of one of `count` equal parts."""
        return Timing.of([t / count for t in self.samples])


# The least time one timing covers. Ranks that share cores take turns on them in time
# slices of the scheduler (several ms): a timing shorter than a few slices can run whole
# while the other ranks wait their turn, and would measure a rank alone. One that spans
# many measures each rank's share of the cores, as a step gets it.
MIN_TIMING_S = 0.1


def timed(run: Callable[[], object], repeats: int, *,
          sync: Callable[[], object] = lambda: None,
          align: Callable[[], object] = lambda: None) -> Timing:
    """`run` timed `repeats` times after two untimed calls (allocation and first dispatch;
    then how long one call takes); each timing covers enough calls to last `MIN_TIMING_S`
    and is divided by their number.
    `sync` waits for the device's queued work (`torch.cuda.synchronize` on a GPU), before
    each timing starts and before it ends; `align` (a barrier of the ranks) starts every
    timing at once on every rank, so that the ranks' k-th timings ran side by side."""
    run()
    sync()
    start = time.perf_counter()
    run()
    sync()
    once = time.perf_counter() - start
    inner = max(1, math.ceil(MIN_TIMING_S / once)) if once > 0 else 1
    seconds = []
    for _ in range(repeats):
        align()
        sync()
        start = time.perf_counter()
        for _ in range(inner):
            run()
        sync()
        seconds.append((time.perf_counter() - start) / inner)
    return Timing.of(seconds)


def combined(timings: Sequence[Timing]) -> Timing:
    """One figure from the ranks' timings, as a step of all of them sees it: the ranks'
    k-th timings ran side by side (`timed`'s `align`), and a step waits for the slowest
    rank, so each figure is the mean (and median) over k of the slowest rank's k-th
    timing. Its spread is the larger of the relative range of the ranks' medians and of
    each rank's interquartile range."""
    medians = [t.median for t in timings]
    value = statistics.median(medians)
    across = (max(medians) - min(medians)) / value if value else 0.0
    slowest = Timing.of([max(ts) for ts in zip(*(t.samples for t in timings))])
    return Timing(slowest.median, max(across, max(t.spread for t in timings)), slowest.mean,
                  slowest.samples)
