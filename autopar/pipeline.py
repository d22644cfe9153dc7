"""Pipeline parallelism: the request (`Pipeline`), torch's schedules, and their cost model.

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
min(v m, (v - 1) p + 2 (p - 1 - r) + 1) stage-forwards on rank r, torch's own warm-up
count, shared by its v stages; InterleavedZeroBubble as many (fewer warm-up forwards, but
each deferred weight pass keeps its micro-batch's weight-gradient inputs: ZB-H1 holds
1F1B's peak).

ZBVZeroBubble and DualPipeV place two stages per rank in a V (rank r holds stages r and
2p - 1 - r), not round-robin as the planner cuts them: named but refused
(`PipelineError`). LoopedBFS takes no chunking specification for its inputs, which the
runtime needs to hand each stage the user inputs it reads (cut or whole): refused too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autopar.errors import PipelineError

# Forward : backward work of a stage (the backward computes two matmuls per forward one),
# and of the backward the weight gradient's share (one of those two).
FORWARD_SHARE = 1 / 3
WEIGHT_SHARE = 1 / 3


@dataclass(frozen=True)
class Schedule:
    """One of torch.distributed.pipelining's schedules, as the planner models it.

    `name` is the torch class's name without "Schedule"; `virtual` the stages per rank it
    runs (1, or None: any count of at least 2); `runs` whether autopar's runtime runs it;
    `splits_backward` whether it runs each backward as an input pass and a later weight
    pass (the zero-bubble schedules)."""

    name: str
    virtual: int | None
    runs: bool = True
    splits_backward: bool = False

    @property
    def torch_class(self) -> str:
        return f"Schedule{self.name}"

    def check_microbatches(self, microbatches: int, ranks: int) -> str | None:
        """Why `microbatches` can't run on `ranks` pipeline ranks (None when they can)."""
        if microbatches < 1:
            return "at least one micro-batch"
        if self.name == "1F1B" and microbatches < ranks:
            return f"1F1B needs at least as many micro-batches as pipeline ranks ({ranks})"
        rounds = max(1, microbatches // ranks)
        if self.virtual is None and microbatches % rounds:
            return (f"{self.name} runs max(1, m // {ranks}) rounds of micro-batches and "
                    f"needs m to be a multiple of them ({microbatches} is not of {rounds})")
        return None


SCHEDULES: dict[str, Schedule] = {s.name: s for s in (
    Schedule("GPipe", 1),
    Schedule("1F1B", 1),
    Schedule("Interleaved1F1B", None),
    Schedule("LoopedBFS", None, runs=False),
    Schedule("InterleavedZeroBubble", None, splits_backward=True),
    Schedule("ZBVZeroBubble", 2, runs=False, splits_backward=True),
    Schedule("DualPipeV", 2, runs=False, splits_backward=True),
)}
RUNNABLE = tuple(name for name, s in SCHEDULES.items() if s.runs)


def schedule_named(name: str) -> Schedule:
    """The schedule called `name` (torch's class name without "Schedule", any case); a
    `PipelineError` naming those torch has, or those the runtime runs, otherwise."""
    found = {key.lower(): s for key, s in SCHEDULES.items()}.get(str(name).lower().removeprefix(
        "schedule"))
    if found is None:
        raise PipelineError(f"no pipeline schedule called {name!r}",
                            expected=f"one of {', '.join(SCHEDULES)} (torch's schedule "
                                     "classes without 'Schedule')", got=repr(name),
                            fix="schedule='1F1B', or leave schedule=None to let the planner "
                                "choose")
    if not found.runs:
        raise PipelineError(f"the {found.name} schedule is not run by autopar yet",
                            expected=f"one of {', '.join(RUNNABLE)}", got=found.name,
                            fix="schedule='Interleaved1F1B' for a small bubble, or None")
    return found


@dataclass(frozen=True)
class Pipeline:
    """A pipeline to plan for: over mesh axis `axis`, in `stages` stages (default one per
    rank, two per rank for the interleaved schedules), with `microbatches` micro-batches and
    `schedule` (None: the planner chooses each among what fits and runs fastest)."""

    axis: str = "pp"
    stages: int | None = None
    microbatches: int | None = None
    schedule: str | None = None

    def __post_init__(self) -> None:
        if self.schedule is not None:
            object.__setattr__(self, "schedule", schedule_named(self.schedule).name)
        for field, value in (("stages", self.stages), ("microbatches", self.microbatches)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise PipelineError(f"Pipeline.{field} must be a positive count",
                                    expected="a positive int, or None for the planner to "
                                             "choose", got=repr(value),
                                    fix=f"Pipeline({field}=4)")

    def schedules(self) -> tuple[Schedule, ...]:
        """The schedules to consider: the one asked for, else every one the runtime runs."""
        names = (self.schedule,) if self.schedule else RUNNABLE
        return tuple(SCHEDULES[name] for name in names)

    def stage_counts(self, schedule: Schedule, ranks: int) -> tuple[int, ...]:
        """The stage counts `schedule` can run on `ranks` pipeline ranks, as asked."""
        if schedule.virtual == 1:
            counts = (ranks,)
        elif schedule.virtual is not None:
            counts = (schedule.virtual * ranks,)
        else:
            counts = (2 * ranks,)
        if self.stages is None:
            return counts
        if self.stages % ranks or (schedule.virtual == 1 and self.stages != ranks) or (
                schedule.virtual != 1 and self.stages < 2 * ranks):
            return ()
        return (self.stages,)


def check_request(pipeline: Pipeline, ranks: int, blocks: int, batch: int | None) -> None:
    """Refuse, before any solve, a `pipeline` that can't run on `ranks` pipeline ranks for a
    model of `blocks` blocks and a batch of `batch` samples (`PipelineError` with the fix)."""
    if ranks < 2:
        raise PipelineError(f"pipeline axis {pipeline.axis!r} has {ranks} device",
                            expected="a pipeline axis of at least 2 devices",
                            got=f"{ranks}", fix="give the mesh a 'pp' axis of 2 or more")
    runnable = [s for s in pipeline.schedules() if pipeline.stage_counts(s, ranks)]
    if not runnable:
        raise PipelineError(f"{pipeline.stages} stages can't run on {ranks} pipeline ranks",
                            expected=f"{ranks} stages (one per rank) or a multiple of {ranks} "
                                     "of at least twice that (interleaved)",
                            got=f"stages={pipeline.stages}, schedule={pipeline.schedule}",
                            fix=f"Pipeline(stages={ranks}) or leave stages=None")
    least = min(min(pipeline.stage_counts(s, ranks)) for s in runnable)
    if least > blocks:
        raise PipelineError(f"{least} stages need at least {least} blocks to cut between",
                            expected=f"at most {blocks} stages (the model's blocks: layers "
                                     "of a ModuleList)", got=f"{least} stages",
                            fix="use fewer pipeline ranks or stages, or a deeper model")
    if pipeline.microbatches is not None:
        if batch is not None and batch % pipeline.microbatches:
            raise PipelineError(f"{pipeline.microbatches} micro-batches don't divide the "
                                f"batch of {batch}", expected="a divisor of the batch",
                                got=str(pipeline.microbatches),
                                fix=f"microbatches in {divisors(batch)}")
        reasons = [s.check_microbatches(pipeline.microbatches, ranks) for s in runnable]
        if all(reasons):
            raise PipelineError(f"{pipeline.microbatches} micro-batches can't run the "
                                "pipeline", expected=reasons[0], got=str(pipeline.microbatches),
                                fix=f"microbatches={_least_fitting(runnable, ranks, batch)}")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _least_fitting(schedules: Sequence[Schedule], ranks: int, batch: int | None) -> int:
    for m in divisors(batch) if batch else range(1, 4 * ranks + 1):
        if any(s.check_microbatches(m, ranks) is None for s in schedules):
            return m
    return ranks


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
              virtual: int) -> int:
    """Micro-batches whose activations each stage of pipeline rank `rank` holds at the
    peak (module docstring)."""
    m = microbatches
    if schedule.name in ("GPipe", "LoopedBFS"):  # every forward before the first backward
        return m
    if virtual == 1:
        return min(m, ranks - rank)
    forwards = min(virtual * m, (virtual - 1) * ranks + 2 * (ranks - 1 - rank) + 1)
    return math.ceil(forwards / virtual)



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
             schedule: Schedule) -> tuple[Slot, ...]:
    """The step as the cost model sees it: each stage's forward (a third of its time) and
    backward of each micro-batch (with a split backward, its input gradient and its weight
    gradient, a third each), on the rank that runs it, as early as its inputs allow.

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
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * ranks
    held = [0] * ranks
    limit = [virtual * in_flight(schedule, m, ranks, r, virtual) for r in range(ranks)]
    pending = {r: [(kind, k, j) for j in range(m) for k in range(r, stages, ranks)
                   for kind in kinds] for r in range(ranks)}
    slots: list[Slot] = []

    def ready(kind: str, k: int, j: int) -> float | None:
        if kind == "W":
            needs = [("B", k, j)]
        elif kind == "F":
            needs = [("F", k - 1, j)] if k else []
        else:
            needs = [("F", k, j)] + ([("B", k + 1, j)] if k + 1 < stages else [])
        times = [done.get(need) for need in needs]
        return None if any(t is None for t in times) else max(times, default=0.0)

    while any(pending.values()):
        best = None
        for r, work in pending.items():
            options = [(ready(*w), w) for w in work]
            options = [(t, w) for t, w in options if t is not None]
            if not options:
                continue
            backward = [o for o in options if o[1][0] == "B"]
            forward = sorted((o for o in options if o[1][0] == "F"),
                             key=lambda o: (o[1][2], o[1][1]))
            weights = [o for o in options if o[1][0] == "W"]
            pick = None
            if schedule.name == "GPipe":
                if forward or backward:
                    pick = forward[0] if forward else min(backward,
                                                          key=lambda o: (o[1][2], -o[1][1]))
            elif backward and (held[r] >= limit[r] or not forward):
                pick = min(backward, key=lambda o: (o[0], o[1][2]))
            elif forward or backward:
                pick = forward[0] if forward else min(backward, key=lambda o: o[0])
            if weights:
                weight = min(weights, key=lambda o: (o[0], o[1][2]))
                if pick is None or max(free[r], weight[0]) < max(free[r], pick[0]):
                    pick = weight
            assert pick is not None
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
