"""Which micro-batch counts a search tries next, and when memory binds: the pipeline's
rounds of counts (`next_counts`, `settled`; `autopar.planning.pipeline.plan`) and the plain
plan's doubling (`memory_binds`; `autopar.planning.layout`)."""

from __future__ import annotations

from autopar.planning.deadline import Deadline, expired
from autopar.values.plan import Plan

# With microbatches=None, the counts of a pipeline's first round: divisors of the batch up
# to this many per pipeline rank. At 4 the bubble of 1F1B is already (p - 1) / (5p - 1) <
# 20%, and each count costs a capture of the model at its micro-batch.
MAX_MICROBATCHES_PER_RANK = 4
# Past the first count, more micro-batches are tried while the best plan so far holds at
# least this fraction of the memory budget (or none fits): beyond a few they mostly trade
# step time (smaller matmuls, collectives repeated) for activation memory.
MEMORY_BINDS = 0.8
# The most micro-batches a step is cut into: enough for one sample per data-parallel rank
# at the batches large models train at (Megatron-LM's micro-batch of 1: a 1024-sample batch
# over 8 such ranks is 128 micro-batches).
MAX_MICROBATCHES = 256


def memory_binds(best: Plan | None, budget: float) -> bool:
    """Whether more micro-batches may pay: no plan fits yet, or the best holds at least
    `MEMORY_BINDS` of the budget."""
    return best is None or best.peak_memory_bytes >= MEMORY_BINDS * budget


def next_counts(allowed: list[int], first: tuple[int, ...], tried: list[int],
                best: Plan | None, memory_budget: float | None, *, improved: bool,
                descending: bool) -> list[int]:
    """The micro-batch counts of a pipeline's next round, after the `first` round's (p to
    `MAX_MICROBATCHES_PER_RANK` p) and the others `tried`, among the `allowed` counts;
    `best`: the best plan so far; `improved`: whether the last round found it. None without
    a memory limit (more micro-batches only trade time for activation memory). While the
    counts tried fit and memory binds (`memory_binds`), twice the most tried, as long as
    that improved. When none fits, the most allowed (the fewest activations a micro-batch,
    the least bubble), and once that fits, `descending` from it, fewer while they improve:
    a step over m micro-batches is about (m + p - 1)(c / m + a), the bubble (p - 1) c / m
    falling with m, the costs each micro-batch pays again (a: collective latencies,
    smaller matmuls) rising, convex in m while a micro-batch splits as its plans want.
    When the most does not fit either, twice the most of the others: a micro-batch too
    small to split over the data-parallel ranks can hold more than a larger one."""
    top, untried = max(allowed), [m for m in allowed if m not in tried]
    if memory_budget is None or not untried:
        return []
    if descending:
        fewer = [m for m in untried if max(first) < m < min(tried[len(first):])]
        return [max(fewer)] if improved and fewer else []
    if best is None and top not in tried:
        return [top]
    # Some count below the most was tried: the first round's, whenever any is untried.
    doubled = 2 * max(m for m in tried if m != top)
    if memory_binds(best, memory_budget) and (improved or best is None) and doubled in untried:
        return [doubled]
    return []


def settled(best: Plan | None, memory_budget: float | None, deadline: Deadline | None, *,
            descending: bool) -> bool:
    """Whether a pipeline's search starts no other round of counts for want of time: the
    call's deadline has passed, a plan fits (until one does, the search goes on), and
    either the counts are `descending` from the most (fewer hold more activations) or
    memory does not bind. A plan it binds may be one memory forced far from its step
    without that pressure (the 405B shape at 64 micro-batches fits at 4.7 times the step
    it takes at 128), and more micro-batches are what relieves it. The round begun is
    screened to its end: its schedules differ in what their bounds do not see, the memory
    each stage holds."""
    if best is None or not expired(deadline):
        return False
    return descending or memory_budget is None or not memory_binds(best, memory_budget)
