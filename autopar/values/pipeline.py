"""A pipeline to plan for (`Pipeline`), and torch.distributed.pipelining's schedules as
the planner knows them (`SCHEDULES`): which run, with how many stages per rank. Their
timing is `autopar.costs.schedule`'s."""

from __future__ import annotations

from dataclasses import dataclass

from autopar.errors import PipelineError


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
    `schedule` (None: the planner chooses each among what fits and runs fastest). `cuts`,
    the first block of each stage after the first (None: the planner balances them),
    fixes the stages' blocks and their count (a prefill program cut as its decode program
    was)."""

    axis: str = "pp"
    stages: int | None = None
    microbatches: int | None = None
    schedule: str | None = None
    cuts: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.schedule is not None:
            object.__setattr__(self, "schedule", schedule_named(self.schedule).name)
        if self.cuts is not None:
            self._check_cuts()
        for field, value in (("stages", self.stages), ("microbatches", self.microbatches)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise PipelineError(f"Pipeline.{field} must be a positive count",
                                    expected="a positive int, or None for the planner to "
                                             "choose", got=repr(value),
                                    fix=f"Pipeline({field}=4)")

    def _check_cuts(self) -> None:
        cuts = self.cuts
        increasing = isinstance(cuts, tuple) and all(
            isinstance(c, int) and not isinstance(c, bool) for c in cuts) and all(
            a < b for a, b in zip((0, *cuts), cuts))
        if not increasing or not cuts or self.stages not in (None, len(cuts) + 1):
            raise PipelineError("Pipeline.cuts must be the first block of each stage after "
                                "the first, increasing", expected="e.g. cuts=(40,) for two "
                                "stages of a model of 80 blocks, one fewer than stages",
                                got=f"cuts={cuts!r}, stages={self.stages!r}",
                                fix="Pipeline(cuts=(40,)), or leave cuts out")
        object.__setattr__(self, "stages", len(cuts) + 1)

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
