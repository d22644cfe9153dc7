"""Planning entry points: `plan` (no process group needed) and `plan_graph`."""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import NoReturn

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils import _pytree as pytree

from autopar.errors import InfeasiblePlanError, MicrobatchError, PipelineError, ShardingError
from autopar.mesh import Mesh
from autopar.micro_batches import MicroBatches
from autopar.optimizer_state import ADAMW, OptimizerState, optimizer_state
from autopar.passes.annotate import DATA_MOVEMENT, FORMULA, annotate, flop_source, size_hints
from autopar.passes.build_problem import ProblemBuild, build_problem
from autopar.passes.capture import capture, loss_output
from autopar.passes.constrain import constrain
from autopar.passes.edge_costs import Background, EdgeCache, EdgeCaches
from autopar.passes.extract_plan import exposed_charges, extract_plan
from autopar.passes.find_saved import find_saved
from autopar.passes.find_strategies import StrategyTable, find_strategies
from autopar.passes.fold_depth import fold_depth
from autopar.passes.offer_recompute import offer_recompute
from autopar.passes.offer_whole_gradient import offer_whole_gradient
from autopar.passes.split_batch import BatchSplit, batch_size
from autopar.pipeline import Pipeline
from autopar.pipeline_plan import MAX_MICROBATCHES, MEMORY_BINDS, plan_pipeline
from autopar.plan_types import Plan
from autopar.solver import Solution, min_peak_usage, solve
from autopar.specs import TENSOR

# Solves at most, re-estimating how much of the background collectives stays exposed.
OVERLAP_ROUNDS = 3
# The fraction of the time limit a candidate's screening solve has (`screened`).
SCREENING_TIME = 0.25


# Prefix of the progress messages that start a pass (benchmarks time the passes by them);
# the hand strategies' solves are announced the same way.
STAGE = "[stage]"


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def plan(model: nn.Module, mesh: Mesh, example_inputs: tuple, *,
         memory_budget: float | None = None, time_limit: float = 30.0,
         dynamic_shapes=None, constraints: Mapping[str, str] | None = None,
         fold_layers: bool = True, seed: int = 0, hand_strategies: bool = False,
         optimizer: object = None, master_weights: torch.dtype | None = None,
         recompute: bool = True, microbatches: int | str = "auto",
         pipeline: Pipeline | str | bool = "auto",
         progress: Callable[[str], None] | None = None) -> Plan:
    """Choose how every op and tensor of `model` is split over `mesh`.

    `example_inputs` may live on the meta device (and the model too), so plans for large
    models need no memory. The plan minimises the modelled training step time such that
    every device holds at most `memory_budget` bytes (default: the hardware's memory).
    `constraints` pins named tensors' placements (see `autopar.passes.constrain`; with a
    pipeline, placements on the whole mesh replicated on the pipeline axis, each applied in
    the stage holding the tensor);
    `fold_layers` makes identical blocks share one decision. With `hand_strategies`, the
    plan also carries the standard hand-written strategies (data parallel, ZeRO-3, Megatron,
    data x tensor, and with recomputation) costed the same way (`autopar.hand_strategies`),
    which costs one more solve each. `optimizer` is what the model is trained with: a torch
    optimizer class, `(class, options)` or state bytes per parameter element (default
    AdamW; `autopar.optimizer_state`), stepping a `master_weights` copy (e.g.
    torch.float32 for a bfloat16 model) when given. `recompute` lets the solver recompute
    activations in the backward instead of keeping them. `microbatches` runs a step as
    that many micro-batches one after the other (gradient accumulation: one micro-batch's
    activations at a time, against smaller matmuls and collectives repeated per
    micro-batch); "auto" tries more of them while the plan of fewer holds most of the
    memory budget, and keeps the fastest plan (see `_plan_steps`). `pipeline` cuts the
    model into stages of consecutive blocks over one mesh axis (`autopar.Pipeline`: axis,
    stages, micro-batches, schedule; `autopar.pipeline_plan`); "auto" (the default) also
    plans a pipeline over the axis named "pp" when the mesh has one and keeps it when it
    is faster, False never pipelines. `progress` receives a
    message as each pass starts (prefixed `STAGE`) and the solver's progress lines. Each
    distinct warning raised while planning is issued once, at the end, and kept in the
    plan's `warnings` (which its summary prints). Raises
    `InfeasiblePlanError` with the least memory any plan needs when nothing fits,
    `OptimizerError` for an optimizer whose state the cost model can't size, and
    `MicrobatchError` for a count of micro-batches the model's step can't be cut into.
    """
    state = optimizer_state(optimizer, master_weights=master_weights)  # bad input: fail early
    say = progress or (lambda message: None)
    raised: list[str] = []
    with _warned_once(raised):
        say(f"{STAGE} capture")
        gm = capture(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
        say(f"{STAGE} annotate")
        if dynamic_shapes is not None and microbatches == "auto":
            microbatches = 1  # a symbolic batch has no divisors to try
        made = plan_model(model, annotate(gm), tuple(example_inputs), mesh,
                          microbatches=microbatches, model_name=type(model).__name__,
                          memory_budget=memory_budget, time_limit=time_limit,
                          constraints=constraints, fold_layers=fold_layers, seed=seed,
                          hand_strategies=hand_strategies, optimizer=state,
                          recompute=recompute, pipeline=pipeline, progress=progress)
    return dataclasses.replace(made, warnings=_merge_warnings(made.warnings, raised))


def input_signature(example_inputs: tuple) -> tuple[str, ...]:
    """Each flat input leaf as `dtype[shape]` (tensors) or its repr: what a plan is for."""
    def describe(value: object) -> str:
        if isinstance(value, torch.Tensor):
            return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
        return repr(value)

    return tuple(describe(leaf) for leaf in pytree.tree_leaves(tuple(example_inputs)))


def graph_digest(gm: fx.GraphModule) -> str:
    """A digest of every node's name, op and tensor shapes and dtypes: equal for the same
    model captured at the same input shapes."""
    digest = hashlib.sha256()
    for node in gm.graph.nodes:
        digest.update(f"{node.name} {node.target} {node.meta.get(TENSOR)}\n".encode())
    return digest.hexdigest()[:16]


def plan_model(model: nn.Module, gm: fx.GraphModule, example_inputs: tuple, mesh: Mesh, *,
               microbatches: int | str, pipeline: Pipeline | str | bool = "auto",
               **options) -> Plan:
    """`_plan_layout`'s plan, recording the example inputs it is for, and the warnings
    raised while planning once each (`_warned_once`)."""
    raised: list[str] = []
    with _warned_once(raised):
        made = _plan_layout(model, gm, example_inputs, mesh, microbatches=microbatches,
                            pipeline=pipeline, **options)
    return dataclasses.replace(made, inputs=input_signature(example_inputs),
                               graph=graph_digest(gm),
                               warnings=_merge_warnings(made.warnings, raised))


@contextmanager
def _warned_once(raised: list[str]) -> Iterator[None]:
    """Hold back the warnings raised inside; at the end issue each distinct one once (every
    solve finds the strategies again, and warns again) and append its message to `raised`,
    for the plan's `warnings` (`_merge_warnings`)."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        for category, message in dict.fromkeys((w.category, str(w.message)) for w in caught):
            # 4: past this generator and contextlib, to the caller of the function using it.
            warnings.warn(message, category, stacklevel=4)
            raised.append(message)


_NO_RULE = "no sharding rule for "


def _unruled_warnings(gm: fx.GraphModule, table: StrategyTable) -> tuple[str, ...]:
    """One warning per op the strategy pass replicated for want of a rule, with how its
    FLOPs were counted when no formula knows it (`annotate.flop_source`)."""
    sources = {str(node.target): flop_source(node) for node in gm.graph.nodes
               if node.op == "call_function"}
    warned = []
    for op in table.unsupported:
        source = sources.get(op, FORMULA)
        guess = "" if source in (FORMULA, DATA_MOVEMENT) else (
            f"; no FLOP formula either ({source} of its largest tensor)")
        warned.append(f"{_NO_RULE}{op}: kept replicated{guess}")
    return tuple(warned)


def _merge_warnings(kept: tuple[str, ...], raised: list[str]) -> tuple[str, ...]:
    """The plan's warnings, each once, then those raised while planning that they don't
    already say (the strategy pass's "no sharding rule for a, b: replicated" is the plan's
    "no sharding rule for a: kept replicated" per op)."""
    merged = list(dict.fromkeys(kept))
    for message in raised:
        if message.startswith(_NO_RULE):
            ops = message.removeprefix(_NO_RULE).rsplit(": ", 1)[0].split(", ")
            if all(any(w.startswith(f"{_NO_RULE}{op}:") for w in merged) for op in ops):
                continue
        if message not in merged:
            merged.append(message)
    return tuple(merged)


def pipeline_request(mesh: Mesh, pipeline: Pipeline | str | bool | None) -> Pipeline | None:
    """The pipeline `plan(pipeline=...)` asks for on `mesh`: the one given, one over the
    axis named "pp" for "auto" when the mesh has it (of 2 or more), else None."""
    if isinstance(pipeline, Pipeline):
        return pipeline
    if pipeline is False or pipeline is None:
        return None
    if pipeline == "auto":
        names = mesh.axis_names
        return Pipeline() if "pp" in names and mesh.shape[names.index("pp")] > 1 else None
    raise PipelineError("pipeline must be 'auto', False or an autopar.Pipeline",
                        expected="'auto', False or Pipeline(axis='pp', ...)",
                        got=repr(pipeline), fix="pipeline=autopar.Pipeline(schedule='1F1B')")


def _plan_layout(model: nn.Module, gm: fx.GraphModule, example_inputs: tuple, mesh: Mesh, *,
                 microbatches: int | str, pipeline: Pipeline | str | bool,
                 memory_budget: float | None = None, **options) -> Plan:
    """The plan without a pipeline (`_plan_steps`), the pipelined one (`plan_pipeline`),
    or under "auto" the faster of both that fits (a pipeline that can't run, for want of
    blocks or of micro-batches, is not a candidate then); with hand strategies, Megatron
    3D among them (`_with_megatron_3d`)."""
    request = pipeline_request(mesh, pipeline)
    budget = float(memory_budget if memory_budget is not None else mesh.hardware.memory_bytes)
    options = {**options, "micro": MicroBatches(model, example_inputs, gm),
               "edge_caches": EdgeCaches()}
    if request is None:
        plain = _plan_steps(model, gm, example_inputs, mesh, microbatches=microbatches,
                            memory_budget=memory_budget, **options)
        return _with_megatron_3d(plain, model, gm, example_inputs, mesh, budget, options,
                                 adopt=pipeline is not False)
    if request.microbatches is None and isinstance(microbatches, int) \
            and not isinstance(microbatches, bool):
        request = dataclasses.replace(request, microbatches=microbatches)
    loss_output(gm)
    stage_options = {k: v for k, v in options.items() if k not in ("hand_strategies",
                                                                   "constraints", "micro")}

    def plan_stage(graph: fx.GraphModule, inner: Mesh, *, screening: bool, **solve) -> Plan:
        chosen = screened(stage_options) if screening else {**stage_options,
                                                            "least_memory": False}
        return plan_graph(graph, inner, **chosen, **solve)

    def pipelined() -> Plan:
        # A pipeline the user asked for accumulates over a model whose ops mix samples
        # (with a warning); "auto" never changes what a step computes.
        return plan_pipeline(gm, mesh, request, plan_stage=plan_stage,
                             memory_budget=budget, micro=options["micro"],
                             progress=options.get("progress"),
                             mixing="accumulate" if isinstance(pipeline, Pipeline) else "refuse",
                             constraints=options.get("constraints"))

    if pipeline != "auto":
        return pipelined()
    return _with_megatron_3d(_faster_of(model, gm, example_inputs, mesh, pipelined,
                                        microbatches=microbatches,
                                        memory_budget=memory_budget, **options),
                             model, gm, example_inputs, mesh, budget, options, adopt=True)


def _with_megatron_3d(chosen: Plan, model: nn.Module, gm: fx.GraphModule,
                      example_inputs: tuple, mesh: Mesh, budget: float, options: dict, *,
                      adopt: bool) -> Plan:
    """`chosen` with the Megatron 3D hand strategy among its records when hand strategies
    are asked for, and with `adopt` replaced by its plan when that fits and is faster (a
    restriction of the same search, as for the other hand strategies)."""
    if not options.get("hand_strategies") or mesh.ndim < 2:
        return chosen
    from autopar.hand_pipeline import megatron_3d  # it plans with plan_table

    state = optimizer_state(options.get("optimizer"))
    record, plan = megatron_3d(model, gm, example_inputs, mesh, memory_budget=budget,
                               edge_caches=options.get("edge_caches"),
                               time_limit=options.get("time_limit", 30.0),
                               fold_layers=options.get("fold_layers", True),
                               seed=options.get("seed", 0), optimizer=state,
                               micro=options["micro"], progress=options.get("progress"))
    records = list(chosen.hand_strategies)
    records.insert(max(0, len(records) - 1), record)  # before the single-device reference
    if adopt and plan is not None and not options.get("constraints") \
            and plan.step_time_s < chosen.step_time_s:
        chosen = dataclasses.replace(plan, model=chosen.model, warnings=chosen.warnings)
    return dataclasses.replace(chosen, hand_strategies=tuple(records))


def _faster_of(model: nn.Module, gm: fx.GraphModule, example_inputs: tuple, mesh: Mesh,
               pipelined: Callable[[], Plan], *, microbatches: int | str,
               memory_budget: float | None, **options) -> Plan:
    """The faster fitting of the plan without a pipeline and the pipelined one (a pipeline
    that can't run, for want of blocks or micro-batches, or doesn't fit is no candidate)."""
    plain: Plan | None = None
    try:  # the least memory a plan needs is searched for only if nothing fits (below)
        plain = _plan_steps(model, gm, example_inputs, mesh, microbatches=microbatches,
                            memory_budget=memory_budget, least_memory=False, **options)
    except InfeasiblePlanError:
        plain = None
    piped: Plan | None = None
    try:
        piped = pipelined()
    except (PipelineError, MicrobatchError, InfeasiblePlanError, ShardingError):
        piped = None  # "auto" pipelines only where a pipeline runs, fits and honours the pins
    if piped is not None and (plain is None or piped.step_time_s < plain.step_time_s):
        return dataclasses.replace(piped, hand_strategies=plain.hand_strategies if plain
                                   else ())
    if plain is None:  # raises the whole step's InfeasiblePlanError, with the least memory
        return _plan_steps(model, gm, example_inputs, mesh,
                           microbatches=1 if microbatches == "auto" else microbatches,
                           memory_budget=memory_budget, **options)
    return plain


def _plan_steps(model: nn.Module, gm: fx.GraphModule, example_inputs: tuple, mesh: Mesh, *,
                microbatches: int | str, memory_budget: float | None = None,
                progress: Callable[[str], None] | None = None,
                micro: MicroBatches, least_memory: bool = True, **options) -> Plan:
    """`plan_graph` of `gm` (`model` captured and annotated at `example_inputs`), run as
    `microbatches` micro-batches: a count, or "auto". With "auto" the step is first planned
    whole; while the best plan so far does not fit, or holds at least `MEMORY_BINDS` of
    the budget, twice as many micro-batches are screened (`screened`), up to
    `MAX_MICROBATCHES` or a step time worse than the best, and the chosen count is planned
    in full: micro-batches only trade time for memory. A model whose step can't be cut (its loss or
    an op mixes samples: `split_batch`) is planned whole under "auto", and raises
    `MicrobatchError` for a count; `LossError` when the forward returns no loss. `micro`:
    the planning call's splits and micro-batch captures.
    `least_memory`: whether the whole step's `InfeasiblePlanError` says the least memory a
    plan needs (a search of its own)."""
    say = progress or (lambda message: None)
    loss_output(gm)  # a model that returns no loss can't be trained: say so before solving
    budget = float(memory_budget if memory_budget is not None else mesh.hardware.memory_bytes)

    def planned(count: int, split: BatchSplit | None, *, screening: bool = False,
                least_memory: bool = True) -> Plan:
        if split is not None:
            say(f"{STAGE} plan {split.describe()}")
        graph = gm if split is None else micro.graph(split)
        chosen = screened(options) if screening else {**options, "least_memory": least_memory}
        return plan_graph(graph, mesh, memory_budget=budget, microbatches=count,
                          progress=progress, **chosen)

    if microbatches != "auto":
        if not isinstance(microbatches, int) or isinstance(microbatches, bool):
            raise MicrobatchError("microbatches must be a count or 'auto'",
                                  expected="a positive int or 'auto'", got=repr(microbatches),
                                  fix="pass microbatches=4, or leave the default 'auto'")
        split = micro.split(microbatches) if microbatches != 1 else None
        return planned(microbatches, split, least_memory=least_memory)
    best: Plan | None = None
    failure: InfeasiblePlanError | None = None
    try:
        best = planned(1, None, least_memory=least_memory)
    except InfeasiblePlanError as error:
        failure = error
    count, batch = 2, batch_size(gm) or 1
    while count <= min(batch, MAX_MICROBATCHES) and batch % count == 0 and (
            best is None or best.peak_memory_bytes >= MEMORY_BINDS * budget):
        try:
            split = micro.split(count)
        except MicrobatchError:
            break
        try:
            candidate = planned(count, split, screening=True)
        except InfeasiblePlanError:
            count *= 2
            continue
        if best is not None and candidate.step_time_s >= best.step_time_s:
            break
        best, count = candidate, count * 2
    if best is None:
        assert failure is not None
        raise failure
    if best.microbatches == 1:
        return best
    try:  # the count chosen by screening, planned in full
        full = planned(best.microbatches, micro.split(best.microbatches))
    except InfeasiblePlanError:
        return best
    return full if full.step_time_s <= best.step_time_s else best


def screened(options: dict) -> dict:
    """`plan_graph`'s `options` for screening one of many candidates (micro-batch counts,
    pipeline cuts and schedules): one solve with `SCREENING_TIME` of the time limit, no
    hand strategies, no least-memory search; the chosen candidate is then planned with
    `options`."""
    return {**options, "time_limit": options.get("time_limit", 30.0) * SCREENING_TIME,
            "overlap_rounds": 1, "hand_strategies": False, "least_memory": False}


def plan_graph(gm: fx.GraphModule, mesh: Mesh, *, model_name: str,
               memory_budget: float | None = None, time_limit: float = 30.0,
               constraints: Mapping[str, str] | None = None, fold_layers: bool = True,
               seed: int = 0, hand_strategies: bool = False, optimizer: object = None,
               master_weights: torch.dtype | None = None, recompute: bool = True,
               microbatches: int = 1, in_flight: int = 1, least_memory: bool = True,
               overlap_rounds: int = OVERLAP_ROUNDS, edge_caches: EdgeCaches | None = None,
               progress: Callable[[str], None] | None = None) -> Plan:
    """`plan` from the strategy pass on, for a graph already captured and annotated (with
    `microbatches` > 1, one micro-batch's graph, run that many times a step, holding
    `in_flight` micro-batches' activations at once: see `build_problem`; `least_memory`,
    `overlap_rounds`: see `plan_table`; `edge_caches`: the planning call's, to share edge
    costs with its other problems). The
    hand strategies, when asked for, ignore `constraints`: they are the standard ones;
    without constraints, a hand strategy's plan that fits and is faster is the plan."""
    state = optimizer_state(optimizer, master_weights=master_weights)
    say = progress or (lambda message: None)
    budget = float(memory_budget if memory_budget is not None else mesh.hardware.memory_bytes)
    if fold_layers:  # tied blocks: plan one of them for all (its plan is the whole graph's)
        say(f"{STAGE} fold_depth")
        gm = fold_depth(gm, keep=frozenset(constraints or ()))
    say(f"{STAGE} find_strategies")
    found = table = find_strategies(gm, mesh)
    if recompute:
        found = table = offer_recompute(gm, table)
    if microbatches > 1:
        found = table = offer_whole_gradient(table)
    if constraints:
        table = constrain(gm, table, mesh, constraints)
    result = plan_table(gm, table, mesh, model_name=model_name, memory_budget=budget,
                        time_limit=time_limit, fold_layers=fold_layers, seed=seed,
                        optimizer=state, microbatches=microbatches, in_flight=in_flight,
                        least_memory=least_memory, overlap_rounds=overlap_rounds,
                        edge_cache=edge_caches.of(mesh) if edge_caches else None,
                        progress=progress)
    if not hand_strategies:
        return result
    from autopar.hand_strategies import evaluate_hand_strategies  # it plans with plan_table

    hand = evaluate_hand_strategies(gm, mesh, memory_budget=budget, time_limit=time_limit,
                                    fold_layers=fold_layers, seed=seed, table=found,
                                    optimizer=state, microbatches=microbatches,
                                    progress=progress)
    # Each hand strategy is a restriction of the same search; the overlap of gradient
    # reductions is estimated round by round (plan_table), so a restricted search can
    # land on a faster plan than the whole one did: keep the fastest of them.
    fastest = hand.fastest_fitting
    if not constraints and fastest is not None and fastest.step_time_s < result.step_time_s:
        result = dataclasses.replace(fastest, model=result.model, warnings=result.warnings)
    return dataclasses.replace(result, hand_strategies=hand.records)


def plan_table(gm: fx.GraphModule, table: StrategyTable, mesh: Mesh, *, model_name: str,
               memory_budget: float | None, time_limit: float, fold_layers: bool, seed: int,
               optimizer: OptimizerState = ADAMW, microbatches: int = 1, in_flight: int = 1,
               least_memory: bool = True, overlap_rounds: int = OVERLAP_ROUNDS,
               edge_cache: EdgeCache | None = None,
               progress: Callable[[str], None] | None = None) -> Plan:
    """The cheapest plan choosing among `table`'s strategies (the problem, solve and
    extract passes), within `memory_budget` bytes per device (None: no limit), for a step
    of `microbatches` runs of `gm`, `in_flight` of them holding activations at once. Raises
    `InfeasiblePlanError` when none fits, with the least memory any plan of the table needs
    when `least_memory` (a search of its own, which a caller trying many candidates skips).

    Gradient reductions the runtime overlaps with the backward cost only what the backward's
    compute does not hide, max(0, G - B), and parameter gathers it starts ahead only what
    the forward's does not, max(0, G' - F): functions of the whole plan that a sum of
    per-op costs can't express. The first solve charges them in full, each next one at the
    fractions the previous plan left exposed (`Background`; at most `overlap_rounds`
    solves, the later ones with half the time limit), and the plan with the least step
    time is returned. `edge_cache`: an `EdgeCache` of `mesh` to keep the edges' costs in
    (by default one of its own).
    """
    say = progress or (lambda message: None)
    hints = size_hints(gm)
    sizes = {str(k): v for k, v in hints.items()}
    warnings = _unruled_warnings(gm, table)
    saved = find_saved(gm)  # the same for every round
    # So are the edges' seconds: only the charges change.
    edges = edge_cache if edge_cache is not None else EdgeCache(mesh)
    best: Plan | None = None
    charges, limit = Background(), time_limit
    for _ in range(overlap_rounds):
        say(f"{STAGE} build_problem (background gradient reductions charged at "
            f"{charges.reductions:.0%}, parameter gathers at {charges.gathers:.0%})")
        build = build_problem(gm, table, mesh, memory_budget=memory_budget, hints=hints,
                              optimizer=optimizer, fold_layers=fold_layers,
                              charges=charges, saved=saved, edge_cache=edges,
                              microbatches=microbatches, in_flight=in_flight)
        say(f"{STAGE} solve ({build.problem.num_nodes} decisions, "
            f"{build.problem.num_edges} edges)")
        solution = solve(build.problem, time_limit=limit, seed=seed, progress=progress)
        if not solution.choices:
            if best is not None:  # the charges change no memory: only time can run out
                break
            _infeasible(build, solution, model_name, memory_budget,
                        time_limit if least_memory else None)
        say(f"{STAGE} extract_plan")
        plan = extract_plan(gm, build, solution, model_name=model_name, sizes=sizes,
                            warnings=warnings)
        if best is None or plan.step_time_s < best.step_time_s:
            best = plan
        exposed = exposed_charges(gm, build, solution, sizes)
        if (abs(exposed.reductions - charges.reductions) < 0.02
                and abs(exposed.gathers - charges.gathers) < 0.02):
            break
        charges, limit = exposed, time_limit / 2
    assert best is not None
    return best


def _infeasible(build: ProblemBuild, solution: Solution, model_name: str,
                memory_budget: float | None, time_limit: float | None) -> NoReturn:
    """Raise `InfeasiblePlanError`; with the least memory any plan needs, searched for
    within `time_limit` seconds, unless that is None."""
    if memory_budget is None:  # only forbidden strategy pairs can leave no plan
        raise InfeasiblePlanError(f"no plan of {model_name} among its allowed strategies",
                                  expected="a strategy table with a compatible choice "
                                  "for every node", got=f"solver status {solution.status}",
                                  fix="allow more strategies (fewer constraints)")
    if time_limit is None:
        raise InfeasiblePlanError(
            f"no plan of {model_name} fits in {_gib(memory_budget)} per device",
            expected="a plan within the memory budget", got=f"solver status {solution.status}",
            fix="raise memory_budget, use more devices, or shrink the batch or model")
    least = min_peak_usage(build.problem, time_limit=time_limit)
    raise InfeasiblePlanError(
        f"no plan of {model_name} fits in {_gib(memory_budget)} per device",
        min_bytes=least, expected=f"a memory budget of at least {_gib(least)}",
        got=_gib(memory_budget),
        fix="raise memory_budget, use more devices, or shrink the batch or model")
