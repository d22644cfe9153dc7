"""The layout of a plan: the plain plan over its micro-batch counts (`plan_unpipelined`), a
pipeline (`autopar.planning.pipeline.plan`), or under "auto" the faster of both, and Megatron 3D
among the hand strategies (`plan_layout`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch.fx as fx
import torch.nn as nn

from autopar.costs.optimizer_state import optimizer_state
from autopar.errors import InfeasiblePlanError, MicrobatchError, PipelineError, ShardingError
from autopar.passes.capturing.capture import is_training, loss_output
from autopar.passes.layout.split_microbatches import batch_size
from autopar.passes.problem.edge_cache import EdgeCaches
from autopar.planning.deadline import Deadline, expired
from autopar.planning.graph import SCREENING_TIME, STAGE, default_budget, refined, screened
from autopar.planning.hand_strategies import MEGATRON_3D, plan_compared, unfit
from autopar.planning.microbatches import MicroBatches
from autopar.planning.pipeline.counts import MAX_MICROBATCHES, memory_binds
from autopar.planning.pipeline.megatron_3d import megatron_3d
from autopar.planning.pipeline.plan import plan_pipeline
from autopar.planning.pipeline.request import pipeline_request
from autopar.values.mesh import Mesh
from autopar.values.microbatch import BatchSplit
from autopar.values.pipeline import Pipeline
from autopar.values.plan import HandStrategyRecord, Plan

# More micro-batches are screened where the memory limit adds more than this share to the
# whole step's objective: the planner's own tolerance against a plan made with ten times
# the time (a plan that memory costs less can't gain more than that).
MEMORY_COSTS = 0.02


def plan_layout(model: nn.Module, gm: fx.GraphModule, example_inputs: tuple, mesh: Mesh, *,
                microbatches: int | str, pipeline: Pipeline | str | bool,
                memory_budget: float | None = None, **options) -> Plan:
    """The plan without a pipeline (`plan_unpipelined`), the pipelined one (`plan_pipeline`),
    or under "auto" the faster of both that fits (a pipeline that can't run, for want of
    blocks or of micro-batches, is not a candidate then); with hand strategies, Megatron
    3D among them (`_with_megatron_3d`)."""
    request = pipeline_request(mesh, pipeline)
    budget = default_budget(mesh, memory_budget)
    options = {**options, "micro": MicroBatches(model, example_inputs, gm),
               "edge_caches": EdgeCaches()}
    if options.get("strategy") == MEGATRON_3D:
        return _megatron_3d_plan(model, gm, example_inputs, mesh, budget, options)
    if request is None:
        plain = plan_unpipelined(model, gm, example_inputs, mesh, microbatches=microbatches,
                                 memory_budget=memory_budget, **options)
        return _with_megatron_3d(plain, model, gm, example_inputs, mesh, budget, options,
                                 adopt=pipeline is not False)
    # A forward's plan runs its batch whole (1); its pipeline chooses its micro-batches.
    if request.microbatches is None and isinstance(microbatches, int) \
            and not isinstance(microbatches, bool) and is_training(gm):
        request = dataclasses.replace(request, microbatches=microbatches)
    if is_training(gm):
        loss_output(gm)
    stage_options = {k: v for k, v in options.items() if k not in ("hand_strategies",
                                                                   "constraints", "micro")}

    def plan_stage(graph: fx.GraphModule, inner: Mesh, *, refining: Plan | None = None,
                   **solve) -> Plan:
        chosen = screened(stage_options) if refining is None else refined(stage_options,
                                                                          refining)
        return plan_compared(graph, inner, **chosen, **solve)

    def pipelined() -> Plan:
        # A pipeline the user asked for accumulates over a model whose ops mix samples
        # (with a warning); "auto" never changes what a step computes.
        return plan_pipeline(gm, mesh, request, plan_stage=plan_stage,
                             memory_budget=budget, micro=options["micro"],
                             progress=options.get("progress"),
                             mixing="accumulate" if isinstance(pipeline, Pipeline) else "refuse",
                             constraints=options.get("constraints"),
                             deadline=options.get("deadline"))

    if pipeline != "auto":
        return pipelined()
    return _with_megatron_3d(_faster_of(model, gm, example_inputs, mesh, pipelined,
                                        microbatches=microbatches,
                                        memory_budget=memory_budget, **options),
                             model, gm, example_inputs, mesh, budget, options, adopt=True)


def _megatron_3d_of(model: nn.Module, gm: fx.GraphModule, example_inputs: tuple, mesh: Mesh,
                    budget: float, options: dict) -> tuple[HandStrategyRecord, Plan | None]:
    """`megatron_3d`'s record and plan with the planning call's `options`."""
    return megatron_3d(model, gm, example_inputs, mesh, memory_budget=budget,
                       edge_caches=options.get("edge_caches"),
                       time_limit=options.get("time_limit", 30.0),
                       fold_layers=options.get("fold_layers", True),
                       seed=options.get("seed", 0),
                       optimizer=optimizer_state(options.get("optimizer")),
                       micro=options["micro"], progress=options.get("progress"),
                       deadline=options.get("deadline"))


def _with_megatron_3d(chosen: Plan, model: nn.Module, gm: fx.GraphModule,
                      example_inputs: tuple, mesh: Mesh, budget: float, options: dict, *,
                      adopt: bool) -> Plan:
    """`chosen` with the Megatron 3D hand strategy among its records when hand strategies
    are asked for, and with `adopt` replaced by its plan when that fits and is faster (a
    restriction of the same search, as for the other hand strategies)."""
    asked = options.get("hand_strategies")
    if not (asked is True or (isinstance(asked, tuple) and MEGATRON_3D in asked)) or mesh.ndim < 2:
        return chosen
    record, plan = _megatron_3d_of(model, gm, example_inputs, mesh, budget, options)
    records = list(chosen.hand_strategies)
    records.insert(max(0, len(records) - 1), record)  # before the single-device reference
    if adopt and plan is not None and not options.get("constraints") \
            and not options.get("strategy") and plan.step_time_s < chosen.step_time_s:
        chosen = dataclasses.replace(plan, model=chosen.model, warnings=chosen.warnings)
    return dataclasses.replace(chosen, hand_strategies=tuple(records))


def _megatron_3d_plan(model: nn.Module, gm: fx.GraphModule, example_inputs: tuple,
                      mesh: Mesh, budget: float, options: dict) -> Plan:
    """The Megatron 3D hand strategy's plan, asked for by name (`strategy`; the options it
    chooses itself are refused before capture, `check_megatron_3d_options`), with its record
    as its only hand strategy; `ShardingError` where no axis can be pipelined over,
    `InfeasiblePlanError` where no plan of it fits."""
    record, plan = _megatron_3d_of(model, gm, example_inputs, mesh, budget, options)
    if record.step_time_s is None:
        raise ShardingError(f"no {MEGATRON_3D} plan on {mesh.describe()}",
                            expected="an axis named pp, or one across nodes, and another",
                            got=record.note or "none", fix="name the pipeline axis pp")
    if plan is None or plan.peak_memory_bytes > budget:
        raise unfit(record, mesh, budget)
    return dataclasses.replace(plan, model=options.get("model_name", plan.model),
                               hand_strategies=(record,))


def _faster_of(model: nn.Module, gm: fx.GraphModule, example_inputs: tuple, mesh: Mesh,
               pipelined: Callable[[], Plan], *, microbatches: int | str,
               memory_budget: float | None, **options) -> Plan:
    """The faster fitting of the pipelined plan and the plan without a pipeline (a pipeline
    that can't run, for want of blocks or micro-batches, or doesn't fit is no candidate).
    The pipeline is planned first: on a mesh with a pipeline axis it is the plan to beat,
    and the plan without one, where only many micro-batches fit, takes long to find: its
    whole step is planned, but more micro-batches are searched for it once the call's
    deadline has passed only when no pipeline fits."""
    if not is_training(gm):
        return _faster_forward(model, gm, example_inputs, mesh, pipelined,
                               memory_budget=memory_budget, **options)
    piped: Plan | None = None
    try:
        piped = pipelined()
    except (PipelineError, MicrobatchError, InfeasiblePlanError, ShardingError):
        piped = None  # "auto" pipelines only where a pipeline runs, fits and honours the pins
    plain: Plan | None = None
    try:  # the least memory a plan needs is searched for only if nothing fits (below)
        plain = plan_unpipelined(model, gm, example_inputs, mesh, microbatches=microbatches,
                                 memory_budget=memory_budget, least_memory=False,
                                 rival=piped.step_time_s if piped else None, **options)
    except InfeasiblePlanError:
        plain = None
    if piped is not None and (plain is None or piped.step_time_s < plain.step_time_s):
        return dataclasses.replace(piped, hand_strategies=plain.hand_strategies if plain
                                   else ())
    if plain is None:  # raises the whole step's InfeasiblePlanError, with the least memory
        return plan_unpipelined(model, gm, example_inputs, mesh,
                                microbatches=1 if microbatches == "auto" else microbatches,
                                memory_budget=memory_budget, **options)
    return plain


def _faster_forward(model: nn.Module, gm: fx.GraphModule, example_inputs: tuple, mesh: Mesh,
                    pipelined: Callable[[], Plan], *, memory_budget: float | None,
                    **options) -> Plan:
    """`_faster_of` for a forward-only graph: the plan without a pipeline first, then the
    pipelined one with what the call's time has left; the faster that fits. A forward's
    pipeline gains latency only where it saves the collectives a plan without it runs
    over the pipeline axis (across nodes) or overlaps its stages over micro-batches, so
    the plan without it is the one to plan in full."""
    plain: Plan | None = None
    try:
        plain = plan_unpipelined(model, gm, example_inputs, mesh, microbatches=1,
                                 memory_budget=memory_budget, least_memory=False, **options)
    except InfeasiblePlanError:
        plain = None
    try:
        piped = pipelined()
    except (PipelineError, MicrobatchError, InfeasiblePlanError, ShardingError):
        piped = None
    if piped is not None and (plain is None or piped.step_time_s < plain.step_time_s):
        return dataclasses.replace(piped, hand_strategies=plain.hand_strategies if plain
                                   else ())
    if plain is None:  # raises the whole step's InfeasiblePlanError, with the least memory
        return plan_unpipelined(model, gm, example_inputs, mesh, microbatches=1,
                                memory_budget=memory_budget, **options)
    return plain


def plan_unpipelined(model: nn.Module, gm: fx.GraphModule, example_inputs: tuple, mesh: Mesh, *,
                     microbatches: int | str, memory_budget: float | None = None,
                     progress: Callable[[str], None] | None = None,
                     micro: MicroBatches, least_memory: bool = True,
                     rival: float | None = None,
                     **options) -> Plan:
    """`plan_graph` of `gm` (`model` captured and annotated at `example_inputs`), run as
    `microbatches` micro-batches: a count, or "auto". With "auto" the step is first planned
    whole; while the best plan so far does not fit, or holds at least `MEMORY_BINDS` of
    the budget, twice as many micro-batches are screened (`screened`), up to
    `MAX_MICROBATCHES` or a step time worse than the best, and the chosen count is planned
    in full: micro-batches only trade time for memory. A model whose step can't be cut (its loss or
    an op mixes samples: `split_microbatches`) is planned whole under "auto", and raises
    `MicrobatchError` for a count; `LossError` when the forward returns no loss. `micro`:
    the planning call's splits and micro-batch captures.
    `least_memory`: whether the whole step's `InfeasiblePlanError` says the least memory a
    plan needs (a search of its own); `rival`: the step of a plan found otherwise (a
    pipeline's) that this one must beat, or None: only without one are more micro-batches
    screened while none fits once the call's deadline has passed, and with one (and no hand
    strategies asked for) the whole step is screened too, and a screened plan is planned in
    full only when it is faster than the rival (`_in_full`)."""
    if is_training(gm):  # a model that returns no loss can't be trained: say so first
        loss_output(gm)
    plain = _Plain(gm, mesh, default_budget(mesh, memory_budget), micro, progress, options)
    if microbatches != "auto":
        if not isinstance(microbatches, int) or isinstance(microbatches, bool):
            raise MicrobatchError("microbatches must be a count or 'auto'",
                                  expected="a positive int or 'auto'", got=repr(microbatches),
                                  fix="pass microbatches=4, or leave the default 'auto'")
        split = micro.split(microbatches) if microbatches != 1 else None
        return plain.planned(microbatches, split, least_memory=least_memory)
    screen_whole = rival is not None and not plain.options.get("hand_strategies")
    best = _screened_best(plain, least_memory=least_memory, rival=rival,
                          screen_whole=screen_whole)
    return _in_full(plain, best, rival, screened=screen_whole or best.microbatches > 1)


@dataclasses.dataclass(frozen=True)
class _Plain:
    """`plan_unpipelined`'s planning of `gm` on `mesh` within `budget`, at one micro-batch
    count: `micro` its splits and captures, `options` `plan_compared`'s."""

    gm: fx.GraphModule
    mesh: Mesh
    budget: float
    micro: MicroBatches
    progress: Callable[[str], None] | None
    options: dict

    def planned(self, count: int, split: BatchSplit | None, *, screening: bool = False,
                screened_plan: Plan | None = None, least_memory: bool = True) -> Plan:
        """The plan of `count` micro-batches cut as `split` (None: the whole step): a
        screening solve (`screening`), `screened_plan` planned in full, or a full solve."""
        say = self.progress or (lambda message: None)
        if split is not None:
            say(f"{STAGE} plan {split.describe()}")
        graph = self.gm if split is None else self.micro.graph(split)
        if screening:
            chosen = screened(self.options)
        elif screened_plan is not None:
            chosen = refined(self.options, screened_plan)
        else:
            chosen = {**self.options, "least_memory": least_memory}
        return plan_compared(graph, self.mesh, memory_budget=self.budget, microbatches=count,
                             progress=self.progress, **chosen)


def _screened_best(plain: _Plain, *, least_memory: bool, rival: float | None,
                   screen_whole: bool) -> Plan:
    """The best plan of the "auto" search (`plan_unpipelined`'s docstring): the whole step
    planned in full (screened with `screen_whole`), then twice as many micro-batches
    screened while memory binds and they may gain (`_may_gain`; or none fits and there is
    no `rival`); raises the whole step's `InfeasiblePlanError` when no count fits
    (searching for the least memory a plan needs only then: another count usually fits)."""
    best: Plan | None = None
    failure: InfeasiblePlanError | None = None
    try:
        best = plain.planned(1, None, least_memory=False, screening=screen_whole)
    except InfeasiblePlanError as error:
        failure = error
    count, batch = 2, batch_size(plain.gm) or 1
    deadline = plain.options.get("deadline")
    while count <= min(batch, MAX_MICROBATCHES) and batch % count == 0 and (
            best is None and rival is None or memory_binds(best, plain.budget) and _may_gain(
                best, deadline, plain.options.get("time_limit", 30.0))):
        try:
            split = plain.micro.split(count)
        except MicrobatchError:
            break
        try:
            candidate = plain.planned(count, split, screening=True)
        except InfeasiblePlanError:
            count *= 2
            continue
        if best is not None and candidate.step_time_s >= best.step_time_s:
            break
        best, count = candidate, count * 2
    if best is None:
        assert failure is not None
        if not least_memory:
            raise failure
        return plain.planned(1, None, least_memory=True)  # raises, with the least memory
    return best


def _may_gain(best: Plan | None, deadline: Deadline | None, time_limit: float) -> bool:
    """Whether more micro-batches may gain on `best` (None: none fits): only what the memory
    limit costs it (micro-batches trade time for memory), so, where its memory-free
    objective is known (`SolverReport.memory_free`), when that is more than `MEMORY_COSTS`
    of it, whatever the deadline (the 70B shape at 64 x 4096 on 8x8 fits its whole step at
    9.9 s a step, and 5.2 s at more micro-batches), and otherwise while the deadline leaves
    more than a screening solve's limit (`SCREENING_TIME` of the limit)."""
    free = None if best is None else best.solver.memory_free
    if free is not None:
        return best.solver.objective > (1 + MEMORY_COSTS) * free
    return deadline is None or deadline.left() > SCREENING_TIME * time_limit


def _in_full(plain: _Plain, best: Plan, rival: float | None, *, screened: bool) -> Plan:
    """`best`, or when it was `screened`, its micro-batch count planned in full where that
    is no slower; not when the deadline has passed, nor when it is no faster than the
    `rival` (its full plan would be a few percent faster at most, and is not needed)."""
    deadline = plain.options.get("deadline")
    if not screened or expired(deadline) or (rival is not None and best.step_time_s >= rival):
        return best
    count = best.microbatches
    try:  # the count chosen by screening, planned in full
        full = plain.planned(count, plain.micro.split(count) if count > 1 else None,
                             screened_plan=best)
    except InfeasiblePlanError:
        return best
    return full if full.step_time_s <= best.step_time_s else best
