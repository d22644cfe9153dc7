"""The cost model of a pipeline schedule: step time, bubble, micro-batches in flight and
the timeline of a step.

A pipeline cuts the model into `s` stages of consecutive blocks, placed round-robin on the
`p` ranks of one mesh axis (stage k on pipeline rank k mod p: `v = s / p` virtual stages
per rank), and runs a step as `m` micro-batches under one of torch.distributed.pipelining's
schedules. Each stage is split over the other axes by its own intra-op plan.

With t_k the forward plus backward time of stage k for one micro-batch, and
tau_r = sum of t_k over the stages of rank r, a step takes

    one stage per rank (GPipe, 1F1B):    T = sum_k t_k + (m - 1) max_k t_k
    v stages per rank (Interleaved1F1B): T = m max_r tau_r + (p - 1) max_k t_k
    InterleavedZeroBubble:               T = m max_r tau_r + (p - 1) f max_k t_k

(balanced: (m + p - 1) t and (m + (p - 1) / v) tau), and the bubble is the idle share,
1 - m max_r tau_r / T: (p - 1) / (m + p - 1) and (p - 1) / (v m + p - 1). The zero-bubble
schedule (ZB-H1 of Qi et al., 2024, interleaved) splits each backward into the input
gradient, which the previous stage waits for, and the weight gradient, which waits for
nothing: run in the ramp-up and ramp-down bubbles, the weight passes leave of each
stage's (p - 1) bubble only f = F + B - W = 1/3 of it (forward, input and weight gradient
a third of t each: `FORWARD_SHARE`, `WEIGHT_SHARE`). A stage holds
the activations of the micro-batches in flight on its rank at the peak (`in_flight`):
GPipe all m (every forward runs before the first backward); 1F1B min(m, p - r) on rank r
(its warm-up forwards plus the one in steady state); Interleaved1F1B
f = min(v m, (v - 1) q + 2 (p - 1 - r) + 1) stage-forwards on rank r (q = m / max(1, m // p)
micro-batches a round), torch's own warm-up count plus one, shared by its v stages as
evenly as they divide: torch's order holds more of them on the rank's first stage (its
rounds come first), but stages cut to equal size hold the same in total, and each stage
is planned within an equal share of the rank's memory; InterleavedZeroBubble as many
(fewer warm-up forwards, but each deferred weight pass keeps its micro-batch's
weight-gradient inputs: ZB-H1 holds 1F1B's peak).

ZBVZeroBubble and DualPipeV place two stages per rank in a V (rank r holds stages r and
2p - 1 - r), not round-robin as the planner cuts them: named but refused
(`PipelineError`). LoopedBFS takes no chunking specification for its inputs, which the
runtime needs to hand each stage the user inputs it reads (cut or whole): refused too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autopar.values.pipeline import Schedule

# Forward : backward work of a stage (the backward computes two matmuls per forward one),
# and of the backward the weight gradient's share (one of those two).
FORWARD_SHARE = 1 / 3
WEIGHT_SHARE = 1 / 3


def rank_of(stage: int, ranks: int) -> int:
    """The pipeline rank that runs `stage` (round-robin: torch's placement)."""
    return stage % ranks


def step_time(stage_times: Sequence[float], microbatches: int, ranks: int,
              schedule: Schedule) -> float:
    """Modelled step of the schedule (module docstring) from each stage's forward plus
    backward time of one micro-batch, in stage order."""
    m, slowest = microbatches, max(stage_times)
    if len(stage_times) == ranks:
        return sum(stage_times) + (m - 1) * slowest
    per_rank = [sum(stage_times[k::ranks]) for k in range(ranks)]
    # A split backward's ramps: F + B - W of the slowest stage, B = 1 - F - W.
    ramp = 1 - 2 * WEIGHT_SHARE if schedule.splits_backward else 1.0
    return m * max(per_rank) + (ranks - 1) * ramp * slowest


def bubble(stage_times: Sequence[float], microbatches: int, ranks: int,
           schedule: Schedule) -> float:
    """The idle share of the step on its busiest rank: 1 - m max_r tau_r / T."""
    total = step_time(stage_times, microbatches, ranks, schedule)
    busiest = max(sum(stage_times[k::ranks]) for k in range(ranks))
    return 1.0 - microbatches * busiest / total if total else 0.0


def in_flight(schedule: Schedule, microbatches: int, ranks: int, rank: int,
              virtual: int, chunk: int = 0) -> int:
    """Micro-batches whose activations stage `chunk` of pipeline rank `rank` (its stage
    chunk * ranks + rank) holds at the rank's peak (module docstring)."""
    m = microbatches
    if schedule.name in ("GPipe", "LoopedBFS"):  # every forward before the first backward
        return m
    if virtual == 1:
        return min(m, ranks - rank)
    per_round = m // max(1, m // ranks)  # torch's micro-batches a round
    forwards = min(virtual * m, (virtual - 1) * per_round + 2 * (ranks - 1 - rank) + 1)
    return forwards // virtual + (chunk < forwards % virtual)


@dataclass(frozen=True)
class Slot:
    """One piece of a step's timeline: `kind` "F" (forward), "B" (backward; with a split
    backward its input gradient) or "W" (a split backward's weight gradient) of
    `microbatch` on `stage`, run by pipeline rank `rank` from `start` to `end` seconds."""

    rank: int
    stage: int
    microbatch: int
    kind: str
    start: float
    end: float


def timeline(stage_times: Sequence[float], microbatches: int, ranks: int,
             schedule: Schedule, *, training: bool = True) -> tuple[Slot, ...]:
    """The step as the cost model sees it: each stage's forward (a third of its time) and
    backward of each micro-batch (with a split backward, its input gradient and its weight
    gradient, a third each), on the rank that runs it, as early as its inputs allow; of a
    forward-only plan (not `training`), the forwards alone, each the stage's whole time.

    A rank runs one piece at a time, in the schedule's order: GPipe every forward before
    any backward; the others a backward as soon as one is ready once the rank holds its
    `in_flight` micro-batches, else the next forward (lowest micro-batch, then lowest
    stage); a weight gradient whenever it can start before that choice could (it fills the
    wait), and those left at the end. A forward of stage k needs stage k-1's; a backward
    needs the stage's forward and stage k+1's backward (the last stage's, its own forward);
    a weight gradient its backward. The makespan is about `step_time` (which the planner
    uses; this only draws it)."""
    stages, m = len(stage_times), microbatches
    virtual = stages // ranks
    kinds = "FBW" if schedule.splits_backward else "FB"
    shares = {"F": FORWARD_SHARE, "W": WEIGHT_SHARE,
              "B": 1 - FORWARD_SHARE - (WEIGHT_SHARE if schedule.splits_backward else 0.0)}
    if not training:
        kinds, shares = "F", {"F": 1.0}
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * ranks
    held = [0] * ranks
    limit = [sum(in_flight(schedule, m, ranks, r, virtual, c) for c in range(virtual))
             for r in range(ranks)]
    pending = {r: [(kind, k, j) for j in range(m) for k in range(r, stages, ranks)
                   for kind in kinds] for r in range(ranks)}
    slots: list[Slot] = []
    while any(pending.values()):
        best = None
        for r, work in pending.items():
            options = [(_ready(w, done, stages), w) for w in work]
            options = [(t, w) for t, w in options if t is not None]
            if not options:
                continue
            pick = _rank_pick(options, schedule, free[r], held[r] >= limit[r])
            start = max(free[r], pick[0])
            if best is None or start < best[0]:
                best = (start, r, pick[1])
        assert best is not None, "a schedule whose work never becomes ready"
        start, r, (kind, k, j) = best
        end = start + shares[kind] * stage_times[k]
        done[(kind, k, j)] = free[r] = end
        held[r] += {"F": 1, "B": -1, "W": 0}[kind]
        pending[r].remove((kind, k, j))
        slots.append(Slot(r, k, j, kind, start, end))
    return tuple(slots)


def _ready(piece: tuple[str, int, int], done: dict[tuple[str, int, int], float],
           stages: int) -> float | None:
    """When `piece` (kind, stage k, micro-batch j) can start: the latest end among the
    pieces it needs (`timeline`'s docstring) that are `done`, None while one is not."""
    kind, k, j = piece
    if kind == "W":
        needs = [("B", k, j)]
    elif kind == "F":
        needs = [("F", k - 1, j)] if k else []
    else:
        needs = [("F", k, j)] + ([("B", k + 1, j)] if k + 1 < stages else [])
    times = [done.get(need) for need in needs]
    return None if any(t is None for t in times) else max(times, default=0.0)


def _rank_pick(options: list[tuple[float, tuple[str, int, int]]], schedule: Schedule,
               free: float, full: bool) -> tuple[float, tuple[str, int, int]]:
    """The piece a rank free from `free` runs next among its ready `options` ((time it
    is ready, piece)), in the schedule's order (`timeline`'s docstring); `full` when the
    rank holds its `in_flight` micro-batches."""
    backward = [o for o in options if o[1][0] == "B"]
    forward = sorted((o for o in options if o[1][0] == "F"),
                     key=lambda o: (o[1][2], o[1][1]))
    weights = [o for o in options if o[1][0] == "W"]
    pick = None
    if schedule.name == "GPipe":
        if forward or backward:
            pick = forward[0] if forward else min(backward,
                                                  key=lambda o: (o[1][2], -o[1][1]))
    elif backward and (full or not forward):
        pick = min(backward, key=lambda o: (o[0], o[1][2]))
    elif forward or backward:
        pick = forward[0] if forward else min(backward, key=lambda o: o[0])
    if weights:
        weight = min(weights, key=lambda o: (o[0], o[1][2]))
        if pick is None or max(free, weight[0]) < max(free, pick[0]):
            pick = weight
    assert pick is not None
    return pick
