"""Planning a pipeline: stage cuts, micro-batches and schedule around the intra-op solver.

For a pipeline over mesh axis `a` of p ranks, every candidate (micro-batch count m,
schedule, stage count s = v p) is planned as follows, and the fastest that fits is kept:

1. the model captured at one micro-batch's shapes (`autopar.planning.microbatches`; the step
   must cut into micro-batches exactly, or, for a pipeline the user asked for, accumulate over
   them: `split_microbatches`);
2. cut into s stages of consecutive blocks balancing their estimated time
   (`split_stages.balanced_cuts`, O(U^2 s) over U blocks);
3. each stage planned by the intra-op solver on the other axes (`sub_mesh`), as a step of m
   micro-batches holding `pipeline.in_flight` of them at once, within the budget / v (a rank
   holds v stages); a weight two stages share (an embedding tied to the head) is pinned in
   the later stages to where the first stored it, so their gradients add up piece by piece;
   a stage's boundary tensors travel as each rank's piece to its counterpart in the next
   stage: the sending stage chooses their placement, the receiving one is pinned to it;
4. costed by the schedule (`pipeline.step_time`) from each stage's time for one micro-batch
   (its plan's per-micro-batch compute and collectives plus its boundary sends over the
   pipeline axis) plus the slowest stage's exposed once-per-step reductions, the shared
   weights' gradient all-reduce and the loss's broadcast.

Stage plans are cached by (m, s, stage, micro-batches in flight, pins), so the schedules
that hold as many activations reuse them, and so are the stages cut for (m, s). The
micro-batch counts are searched round by round
(`autopar.planning.pipeline.counts.next_counts`): first the batch's divisors from p to 4p;
while their best holds `MEMORY_BINDS` of the budget and improves, twice the most tried;
where none fits, the most the batch allows (up to `MAX_MICROBATCHES`), and from there fewer
while they improve (a step is convex in m while a micro-batch splits as its plans want),
or, where the most does not fit either, twice the most of the first round's. Within a
round, candidates are screened a stage at a time, best first (`_screen`): the one of the
least lower bound of its step screens its next stage, the bound being the schedule's step
(monotone in each stage's time) with its screened stages at their times and the others at
their least (`_least_times`: perfect splits, no communication), until the least bound is no
better than the best plan found (branch and bound), so a candidate whose stages lose is
left once the few that show it are screened; a candidate whose stages hold at least the
samples' activations of one that did not fit is skipped; once the call's deadline has
passed, a round is begun only while none fits or, ascending, the best holds `MEMORY_BINDS`
of the budget (`counts.settled`). Candidates are compared by screening solves
(`autopar.planning.graph.screened`); the chosen one's stages are then planned in full
slowest first, until the slowest is one so planned and the others weigh little in the step
(`autopar.planning.pipeline.stages.refined_stages`). Complexity: at most O(|m| x
|schedules|) candidates of s screening solves each, and at most 2s full solves; the
sub-mesh is the same for every stage (the other axes), not searched over as in Alpa, whose
stage DP also chooses a sub-mesh shape per stage.

A forward-only graph (a model as it serves) is pipelined the same way with nothing
backward: its counts are one (the batch whole) and, where its forward splits, those above
(`_forward_counts`); the last stage broadcasts its outputs. `Pipeline.cuts` fixes the
stages' blocks in place of the balanced cuts (a prefill cut as its decode program was).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
from collections.abc import Callable, Mapping

import torch
import torch.fx as fx

from autopar.costs.schedule import in_flight, rank_of, step_time
from autopar.errors import InfeasiblePlanError, MicrobatchError, PipelineError, ShardingError
from autopar.passes.capturing.capture import MUTATED, is_training, outputs_sharded
from autopar.passes.layout.split_microbatches import batch_size
from autopar.passes.layout.split_stages import (
    Stage,
    Units,
    balanced_cuts,
    find_units,
    split_stages,
    unit_times,
)
from autopar.passes.strategies.constrain import pin_placements
from autopar.planning.deadline import Deadline
from autopar.planning.microbatches import MicroBatches
from autopar.planning.pipeline.counts import (
    MAX_MICROBATCHES,
    MAX_MICROBATCHES_PER_RANK,
    next_counts,
    settled,
)
from autopar.planning.pipeline.request import check_request, divisors
from autopar.planning.pipeline.stages import (
    Screening,
    costed,
    holds,
    refined_stages,
    screened_stage,
    screened_stages,
)
from autopar.values.device_kinds import slowest
from autopar.values.hardware import HardwareProfile
from autopar.values.mesh import Mesh
from autopar.values.microbatch import ACCUMULATED, REFUSE
from autopar.values.pipeline import Pipeline, Schedule
from autopar.values.placement import Placements, Replicate, format_placements
from autopar.values.plan import (
    Plan,
    drop_axis,
)


def sub_mesh(mesh: Mesh, axis: int, rank: int | None = None) -> Mesh:
    """`mesh` without axis `axis`, its other axes on the same links and cut by the same
    shares (one device, named "stage", when nothing is left), costed with the mesh's
    profile, or with `rank`, with the kinds of the devices at that index of the axis (of
    a stage of several kinds, each device's own: `autopar.values.device_kinds`)."""
    kinds = mesh.kinds_at(axis, rank) if rank is not None else (mesh.hardware,)
    keep = [i for i in range(mesh.ndim) if i != axis]
    if not keep:
        return Mesh((1,), ("stage",), hardware=slowest(kinds))
    hardware: HardwareProfile | list = slowest(kinds)
    if len(kinds) > 1:  # the stage's devices, row-major, each of its own kind
        devices = torch.arange(mesh.size).reshape(mesh.shape).select(axis, rank).flatten()
        hardware = [mesh.kinds[i] for i in devices.tolist()]
    shares = None if mesh.shares is None else tuple(mesh.shares[i] for i in keep)
    return Mesh(tuple(mesh.shape[i] for i in keep), tuple(mesh.axis_names[i] for i in keep),
                hardware=hardware, links=tuple(mesh.links[i] for i in keep),
                shares=shares if shares and any(w is not None for w in shares) else None)


def pipeline_axis(mesh: Mesh, pipeline: Pipeline) -> int:
    if pipeline.axis not in mesh.axis_names:
        raise PipelineError(f"the mesh has no axis {pipeline.axis!r} to pipeline over",
                            expected=f"one of {', '.join(mesh.axis_names)}",
                            got=pipeline.axis, fix="Pipeline(axis='<a mesh axis name>'), or "
                            "name the pipeline axis of the mesh 'pp'")
    return mesh.axis_index(pipeline.axis)


def plan_pipeline(gm: fx.GraphModule, mesh: Mesh, pipeline: Pipeline, *,
                  plan_stage: Callable[..., Plan], memory_budget: float | None, micro: MicroBatches,
                  progress: Callable[[str], None] | None = None, mixing: str = REFUSE,
                  constraints: Mapping[str, str | Placements] | None = None,
                  deadline: Deadline | None = None) -> Plan:
    """The fastest fitting pipelined plan of `gm` (a model's captured and annotated step) on
    `mesh` as `pipeline` asks (module docstring). `plan_stage(graph, mesh, *, memory_budget,
    microbatches, in_flight, constraints, refining=None)` plans one stage
    (`autopar.planning.graph.plan_graph` with the caller's options): a quick screening solve of a
    candidate (`autopar.planning.graph.screened`), or with `refining`, that screening plan planned
    in full (`autopar.planning.graph.refined`); `micro` splits the step and captures one
    micro-batch (`MicroBatches` of `gm`'s model). `memory_budget` None plans without a
    memory limit. `mixing` is `split_microbatches`'s: with "accumulate" (a pipeline the user asked
    for) a model whose ops mix samples is pipelined as gradient accumulation over the
    micro-batches, and the plan warns so; with "refuse" (what "auto" asks: it must not
    change what a step computes) it raises `MicrobatchError`. `constraints` pin tensors as
    `plan`'s do, with placements on the whole mesh, replicated on the pipeline axis (which
    places stages): each stage that holds a pinned tensor plans it so on the other axes.
    Once the planning call's `deadline` has passed, no other micro-batch count is
    screened than it takes to find a candidate that fits.
    Raises `ShardingError` for a pin that names no tensor or splits over the pipeline axis,
    `PipelineError` for a request that can't run, `MicrobatchError` when the step can't be
    cut into micro-batches, `InfeasiblePlanError` when no candidate fits."""
    say = progress or (lambda message: None)
    axis = pipeline_axis(mesh, pipeline)
    ranks = mesh.shape[axis]
    inner = tuple(sub_mesh(mesh, axis, rank) for rank in range(ranks))
    batch = batch_size(gm)
    if not is_training(gm):
        _check_forward_only(outputs_sharded(gm), gm.meta.get(MUTATED, ()))
    check_request(pipeline, ranks, find_units(gm).count, batch)
    stager = _Stager(mesh, axis, inner, memory_budget, plan_stage, cache={}, splits={},
                     pins=_stage_pins(gm, mesh, axis, constraints or {}), cuts=pipeline.cuts)
    best, failure, mixes = _search(gm, pipeline, micro, mixing, stager, batch, say, deadline)
    if best is None:
        if failure is not None:
            raise failure
        raise PipelineError("no micro-batch count runs the pipeline", expected="a batch "
                            f"that splits into micro-batches for {ranks} pipeline ranks",
                            got=f"batch {batch}", fix="use a larger batch, or fewer ranks")
    return _with_accumulation_warning(_refined(best, stager), mixes)


def _check_forward_only(sharded: bool, mutated: tuple[str, ...]) -> None:
    """`PipelineError` unless a forward-only pipeline returns the outputs whole (not
    `sharded`: the last stage broadcasts them whole) of a graph that writes every buffer
    it updates in place (`write_back`; none left `mutated`, returned new)."""
    if mutated:
        raise PipelineError("a pipelined forward writes its buffers in place",
                            expected="no buffer the forward only writes",
                            got=f"buffers returned new: {', '.join(mutated)}",
                            fix="pipeline=False")
    if sharded:
        raise PipelineError("a pipelined forward returns its outputs whole",
                            expected="outputs='whole' with a pipeline",
                            got="outputs='sharded'",
                            fix="pipeline=False to take the outputs sharded, or "
                                "outputs='whole'")


@dataclasses.dataclass(frozen=True)
class _Stager:
    """What planning any candidate's stages shares: the mesh and its pipeline `axis`, the
    sub-mesh `inner` of the other axes of each pipeline rank (alike but for the devices'
    kind, on a mesh of several), the budget, the caller's `plan_stage`, the stage
    plans' `cache` (filled as candidates are planned), the cuts and stages of each
    micro-batch and stage count (`splits`: the schedules of as many stages cut them alike)
    and the `pins` on the sub-mesh; `cuts` the request's, else None (balanced)."""

    mesh: Mesh
    axis: int
    inner: tuple[Mesh, ...]
    memory_budget: float | None
    plan_stage: Callable[..., Plan]
    cache: dict[tuple, Plan]
    splits: dict[tuple[int, int], tuple[tuple[int, ...], tuple[Stage, ...]]]
    pins: dict[str, str]
    cuts: tuple[int, ...] | None = None

    def cut(self, times: tuple[list[float], ...], count: int) -> tuple[int, ...]:
        """The cuts of `count` stages: the request's, else balancing the units' `times` on
        each pipeline rank (`_measured`), each stage on its rank's."""
        if self.cuts is not None:
            return self.cuts
        return balanced_cuts([times[rank_of(k, self.ranks)] for k in range(count)], count)

    @property
    def ranks(self) -> int:
        return self.mesh.shape[self.axis]

    def screening(self, chosen: _Chosen, least: tuple[float, ...]) -> Screening:
        """The candidate's screening, its stages' times at least `least` (`Screening`)."""
        options = (chosen.schedule, chosen.microbatches, self.ranks, self.inner,
                   self.memory_budget, self.plan_stage, self.cache, self.pins)

        def probe(k: int, pinned: dict[str, str], received: dict[str, str]) -> Plan:
            return screened_stage(chosen.stages, k, *options, pinned, received)[0]

        return Screening(chosen.stages, chosen.schedule, chosen.microbatches, self.ranks,
                         least, screened_stages(chosen.stages, *options), probe)

    def costed(self, chosen: _Chosen, stage_plans: list[Plan]) -> Plan:
        """The candidate's plan of the whole mesh from its stages' (`stages.costed`)."""
        return costed(chosen.stages, chosen.names, stage_plans, chosen.schedule,
                      chosen.microbatches, self.ranks, self.mesh, self.axis,
                      self.memory_budget)


@dataclasses.dataclass(frozen=True)
class _Chosen:
    """A candidate cut into stages: the stages, its units' names, its schedule and
    micro-batch count, and (once planned) its screened `plan`."""

    stages: tuple[Stage, ...]
    names: tuple[str, ...]
    schedule: Schedule
    microbatches: int
    plan: Plan | None = None


def _search(gm: fx.GraphModule, pipeline: Pipeline, micro: MicroBatches, mixing: str,
            stager: _Stager, batch: int | None, say: Callable[[str], None],
            deadline: Deadline | None) -> tuple[_Chosen | None, Exception | None,
                                                 dict[int, str]]:
    """Branch and bound over the candidates (module docstring), round after round of
    micro-batch counts (`next_counts`): the fastest candidate's screened plan (None if
    none fits), the last `InfeasiblePlanError` (None if none), and what mixes samples per
    accumulated count."""
    ranks = stager.ranks
    # Fewer micro-batches than ranks leave most of every rank idle: not worth a solve.
    allowed = [pipeline.microbatches] if pipeline.microbatches else [
        m for m in divisors(batch or 1) if ranks <= m <= MAX_MICROBATCHES]
    if not is_training(gm) and not pipeline.microbatches:
        allowed = _forward_counts(micro, allowed)
    counts = [m for m in allowed if m <= MAX_MICROBATCHES_PER_RANK * ranks] or allowed[:1]
    first, tried = tuple(counts), []
    best: _Chosen | None = None
    failure: Exception | None = None
    mixes: dict[int, str] = {}  # micro-batch count -> what mixes samples, when accumulated
    devices = math.prod(stager.inner[0].shape)
    # (stage count, samples each stage holds) of the candidates that did not fit: one whose
    # stages hold as many or more samples' activations does not fit either.
    overflowing: list[tuple[int, tuple[float, ...]]] = []
    step_times = _measured(gm, stager.inner)[2]
    cuts_of = functools.cache(lambda count: stager.cut(step_times, count))  # any m's
    descending = False  # from the most allowed, which fit where the first round did not
    while counts and not settled(best and best.plan, stager.memory_budget, deadline,
                                 descending=descending):
        before, candidates = best, []
        for m in counts:
            measured = functools.cache(lambda m=m: _measured(
                _micro_graph(gm, micro, m, mixing, mixes), stager.inner))
            candidates += _candidates(pipeline, m, ranks, devices, step_times, cuts_of,
                                      measured)
        # The most micro-batches, tried when the first round fit none, may not fit for
        # being too small to split over the data-parallel ranks, not for holding too
        # many samples: their failures skip no candidate of the counts below.
        jump = counts == [max(allowed)] and max(allowed) not in first
        best, failed = _screen(candidates, best, stager, batch, [] if jump else overflowing,
                               say)
        failure, tried = failed or failure, tried + counts
        descending = descending or (jump and best is not None)
        counts = next_counts(allowed, first, tried, best and best.plan, stager.memory_budget,
                             improved=best is not before, descending=descending)
    return best, failure, mixes


def _forward_counts(micro: MicroBatches, allowed: list[int]) -> list[int]:
    """A forward-only pipeline's micro-batch counts: the batch whole (one: a forward that
    holds a KV cache runs no other), then `allowed` where the forward splits (each
    output made sample by sample)."""
    try:
        if allowed:
            micro.split(allowed[0])
    except MicrobatchError:
        return [1]
    return [1, *allowed]


def _micro_graph(gm: fx.GraphModule, micro: MicroBatches, m: int, mixing: str,
                 mixes: dict[int, str]) -> fx.GraphModule:
    """`gm`'s graph of one of `m` micro-batches (`gm` itself for one), noting in `mixes`
    what mixes the samples where the split accumulates (`split_microbatches`)."""
    if m == 1:
        return gm
    split = micro.split(m, mixing=mixing)
    if split.weighting == ACCUMULATED:
        mixes[m] = split.mixes
    return micro.graph(split)


def _screen(candidates: list[tuple], best: _Chosen | None, stager: _Stager,
            batch: int | None, overflowing: list[tuple[int, tuple[float, ...]]],
            say: Callable[[str], None]) -> tuple[_Chosen | None, Exception | None]:
    """`candidates` screened a stage at a time, best first: the candidate of the least
    bound (before it starts, its `_least_step`; then its `Screening.bound`) screens its next
    stage, until the least bound is no better than the best plan (`best` so far), so that
    a candidate whose stages lose is left after the few that show it. The best after them,
    and the last `InfeasiblePlanError` among them (None if none). A candidate that does not
    fit joins `overflowing`; one that holds at least the samples of one there is skipped."""
    failure: Exception | None = None
    queue: list[tuple[float, int, tuple[_Chosen, Screening] | None]] = [
        (candidate[0], k, None) for k, candidate in enumerate(candidates)]
    heapq.heapify(queue)
    while queue:
        bound, k, started = heapq.heappop(queue)
        if best is not None and bound >= best.plan.step_time_s:
            break  # no candidate left can be faster
        _, m, schedule, count, _ = candidates[k]
        held = _held_samples(schedule, m, stager.ranks, count, batch or m)
        if started is None and (started := _started(
                candidates[k], held, stager, overflowing, say)) is None:
            continue
        chosen, screening = started
        try:
            screening.advance()
        except InfeasiblePlanError as error:
            failure = error
            overflowing.append((count, held))
            continue
        if not screening.done:
            heapq.heappush(queue, (screening.bound(), k, started))
            continue
        plan = stager.costed(chosen, screening.plans)
        if best is None or plan.step_time_s < best.plan.step_time_s:
            best = dataclasses.replace(chosen, plan=plan)
    return best, failure


def _started(candidate: tuple, held: tuple[float, ...], stager: _Stager,
             overflowing: list[tuple[int, tuple[float, ...]]], say: Callable[[str], None]
             ) -> tuple[_Chosen, Screening] | None:
    """`candidate` cut into stages on its micro-batch's graph, and its screening; None when
    its stages hold at least the samples (`held`) of one in `overflowing`."""
    _, m, schedule, count, measured = candidate
    if any(n == count and all(a >= b for a, b in zip(held, least))
           for n, least in overflowing):
        return None
    graph, units, times = measured()
    say(f"[stage] pipeline: {schedule.name}, {count} stages, {m} micro-batches")
    if (m, count) not in stager.splits:
        cuts = stager.cut(times, count)
        stager.splits[m, count] = cuts, split_stages(graph, units, cuts)
    cuts, stages = stager.splits[m, count]
    chosen = _Chosen(stages, units.names, schedule, m)
    return chosen, stager.screening(chosen, _least_times(times, cuts,
                                                         math.prod(stager.inner[0].shape),
                                                         stager.ranks))


def _refined(best: _Chosen, stager: _Stager) -> Plan:
    """The faster of `best`'s screened plan and its stages planned again in full."""
    # Candidates were compared by screening solves (one per stage, every background
    # collective charged, a fraction of the time); the chosen one's slowest stages are
    # planned again in full, estimating what the backward hides (plan_table's rounds).
    mesh, axis = stager.mesh, stager.axis
    stage_plans = refined_stages(best.stages, best.schedule, best.microbatches, stager.ranks,
                                 stager.inner, mesh.axis_names[axis], mesh.axis_links[axis],
                                 stager.memory_budget, stager.plan_stage, stager.cache,
                                 stager.pins)
    refined = costed(best.stages, best.names, stage_plans, best.schedule, best.microbatches,
                     stager.ranks, mesh, axis, stager.memory_budget)
    return min(best.plan, refined, key=lambda plan: plan.step_time_s)


def _with_accumulation_warning(best: Plan, mixes: dict[int, str]) -> Plan:
    """`best`, warning that its step is gradient accumulation when its micro-batch count
    was split so (`mixes`: what mixes the samples, per such count)."""
    if best.microbatches in mixes:
        m = best.microbatches
        best = dataclasses.replace(best, warnings=(*best.warnings, (
            f"the model mixes the samples of a batch ({mixes[m]}): each of the pipeline's {m} "
            "micro-batches runs as the model's batch, so a step is gradient accumulation over "
            f"{m} micro-batches (the mean of their losses and gradients), not the whole "
            "batch's gradient")))
    return best


def _measured(graph: fx.GraphModule, inner: tuple[Mesh, ...]
              ) -> tuple[fx.GraphModule, Units, tuple[list[float], ...]]:
    """`graph` with its units and their times on each pipeline rank's devices (`inner`'s
    profiles; `unit_times`), measured once per kind."""
    units = find_units(graph)
    timed = {}
    for sub in inner:
        if sub.hardware not in timed:
            timed[sub.hardware] = unit_times(graph, units, sub.hardware)
    return graph, units, tuple(timed[sub.hardware] for sub in inner)


def _candidates(pipeline: Pipeline, microbatches: int, ranks: int, devices: int,
                step_times: tuple[list[float], ...],
                cuts_of: Callable[[int], tuple[int, ...]],
                measured: Callable[[], tuple]) -> list[tuple]:
    """The candidates of `microbatches` micro-batches, each `(lower bound of its step
    (`_least_step`), m, schedule, stage count, measured)`: `measured()` captures the
    micro-batch's graph and measures its units (`_measured`, once for all of m's
    candidates), only once a candidate is screened (a capture of a large model takes
    seconds, and most candidates are never screened). The bound divides the whole
    step's unit times `step_times` by m: no more than a micro-batch's own (a unit's time
    is at least proportional to its samples: its weights are read whatever their count),
    cut as `cuts_of(stage count)` cuts the whole step (balanced for every m alike)."""
    runnable = [s for s in pipeline.schedules()
                if s.check_microbatches(microbatches, ranks) is None]
    if not runnable:
        return []
    if {s.name for s in runnable} >= {"GPipe", "1F1B"}:
        # Same step for the same stage times, but each stage holds all m micro-batches,
        # not p - r: GPipe's best plan is never faster than 1F1B's.
        runnable = [s for s in runnable if s.name != "GPipe"]
    times = tuple([t / microbatches for t in own] for own in step_times)
    found = []
    for schedule in runnable:
        for count in pipeline.stage_counts(schedule, ranks):
            if count <= len(times[0]):
                bound = _least_step(times, cuts_of(count), devices, microbatches, ranks,
                                    schedule)
                found.append((bound, microbatches, schedule, count, measured))
    return found


def _least_step(times: tuple[list[float], ...], cuts: tuple[int, ...], devices: int,
                microbatches: int, ranks: int, schedule: Schedule) -> float:
    """A lower bound of a candidate's step: the schedule's step time (monotone in each
    stage's time) of stages at their `_least_times`."""
    return step_time(list(_least_times(times, cuts, devices, ranks)), microbatches, ranks,
                     schedule)


def _least_times(times: tuple[list[float], ...], cuts: tuple[int, ...], devices: int,
                 ranks: int) -> tuple[float, ...]:
    """Each stage's least time per micro-batch: its ops' training compute on one device
    of its pipeline rank (`times` per rank per unit) over the `devices` of the sub-mesh,
    the least any plan of it can take (perfect splits, no communication, no
    recomputation)."""
    bounds = [0, *cuts, len(times[0])]
    return tuple(sum(times[rank_of(k, ranks)][a:b]) / devices
                 for k, (a, b) in enumerate(zip(bounds, bounds[1:])))


def _held_samples(schedule: Schedule, microbatches: int, ranks: int, count: int,
                  batch: int) -> tuple[float, ...]:
    """The samples whose activations each of `count` stages holds at once: micro-batches
    in flight (`pipeline.in_flight`) times the samples of one."""
    virtual = count // ranks
    return tuple(in_flight(schedule, microbatches, ranks, rank_of(k, ranks), virtual,
                           k // ranks)
                 * batch / microbatches for k in range(count))


def _stage_pins(gm: fx.GraphModule, mesh: Mesh, axis: int,
                constraints: Mapping[str, str | Placements]) -> dict[str, str]:
    """`constraints` on the sub-mesh: each pin's placements without the pipeline axis,
    after checking that it names a tensor of `gm`, has one placement per mesh axis and is
    replicated on the pipeline axis."""
    pins = {}
    for name, wanted in constraints.items():
        placements = pin_placements(name, wanted, mesh)
        text = format_placements(placements)
        if not isinstance(placements[axis], Replicate):
            raise ShardingError(
                f"pin of {name!r} splits over the pipeline axis {mesh.axis_names[axis]!r}",
                expected=f"R on axis {mesh.axis_names[axis]!r}, which places stages", got=text,
                fix=f"pin it R on {mesh.axis_names[axis]!r}, or plan with pipeline=False")
        if not holds(gm, name):
            raise ShardingError(f"cannot pin {name!r}: no such tensor in the graph",
                                expected="a parameter or buffer name, or a graph node name",
                                got=repr(name), fix="use a name of the model's state or graph")
        # A mesh of the pipeline axis alone leaves a sub-mesh of one device (`sub_mesh`).
        pins[name] = drop_axis(text, axis) or "R"
    return pins
