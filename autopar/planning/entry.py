"""Planning entry points: `plan` (no process group needed) and `plan_model`; the plan's
layout is `autopar.planning.layout`'s, one graph's plan `autopar.planning.graph`'s."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils import _pytree as pytree

from autopar.costs.optimizer_state import optimizer_state
from autopar.costs.schedule import rank_of
from autopar.errors import MicrobatchError, PlanningError, ProblemFormatError
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import (
    capture,
    is_training,
    leave_outputs_sharded,
    outputs_sharded,
)
from autopar.passes.capturing.write_back import written_buffers
from autopar.passes.problem.edge_costs import Background
from autopar.planning.deadline import Deadline
from autopar.planning.graph import NO_RULE, STAGE, device_budget
from autopar.planning.joint import plan_both
from autopar.planning.layout import plan_layout
from autopar.planning.prefill import check_prefill, with_prefill
from autopar.planning.shares import speed_shares
from autopar.planning.strategy_names import check_hand_strategy_names
from autopar.planning.throughput import check_objective, most_tokens
from autopar.solver.budget import PLANNER_GAP
from autopar.values.compression import check_compression
from autopar.values.mesh import Mesh
from autopar.values.pipeline import Pipeline
from autopar.values.plan import Plan
from autopar.values.specs import TENSOR

# Seconds a planning call may take by default, capture and every solve included.
TIME_LIMIT = 30.0
# What a forward-only plan's parameters hold beside their values (its `optimizer`).
FORWARD_ONLY = "none (forward only: no gradients or optimizer state)"


def plan(model: nn.Module, mesh: Mesh, example_inputs: tuple, *,
         memory_budget: float | None = None, time_limit: float = TIME_LIMIT,
         dynamic_shapes=None, constraints: Mapping[str, str] | None = None,
         fold_layers: bool = True, seed: int = 0,
         hand_strategies: bool | tuple[str, ...] = False, strategy: str | None = None,
         optimizer: object = None, master_weights: torch.dtype | None = None,
         recompute: bool = True, microbatches: int | str = "auto",
         pipeline: Pipeline | str | bool = "auto", training: bool = True,
         outputs: str = "whole", prefill: int | None = None, compression: object = None,
         objective: str = "latency", progress: Callable[[str], None] | None = None) -> Plan:
    """Choose how every op and tensor of `model` is split over `mesh`.

    The model and `example_inputs` may live on the meta device. The plan minimises the modelled
    step time such that every device holds at most `memory_budget` bytes (default: the
    hardware's memory less `HardwareProfile.reserve_bytes`). `time_limit` bounds the whole call
    (`autopar.planning.deadline`). `constraints` pins named tensors' placements (see
    `autopar.passes.strategies.constrain`; with a pipeline, placements on the whole mesh
    replicated on the pipeline axis, each applied in the stage holding the tensor);
    `fold_layers` makes identical blocks share one decision. With `hand_strategies`, the plan
    also carries the standard hand-written strategies (data parallel, ZeRO-3, Megatron, data x
    tensor, and with recomputation) costed the same way (`autopar.planning.hand_strategies`),
    one more solve each; a tuple of their names carries those only. `strategy` names one to
    plan with instead of the solver's free choice (Megatron 3D too). `optimizer` is what the
    model is trained with: a torch optimizer class, `(class, options)` or state bytes per
    parameter element (default AdamW; `autopar.costs.optimizer_state`), stepping a
    `master_weights` copy (e.g. torch.float32 for a bfloat16 model) when given. `recompute`
    lets the solver recompute activations in the backward instead of keeping them.
    `microbatches` runs a step as that many micro-batches (gradient accumulation); "auto"
    tries more while fewer hold most of the budget (`layout.plan_unpipelined`). `pipeline`
    cuts the model into stages of consecutive blocks over one mesh axis (`autopar.Pipeline`;
    `autopar.planning.pipeline.plan`); "auto" (the default) also plans one over the axis named
    "pp" when the mesh has it and keeps it when faster, False never pipelines. `training=False`
    plans the forward alone, as the model serves (one batch, run whole by a pipeline), its
    `outputs` "whole" on every rank or "sharded" as placed (compiled: DTensors; no pipeline);
    a decode program's plan with the `prefill` of that many prompt tokens predicts the time
    to first token (`autopar.planning.prefill`); `objective="throughput"` plans the batch of
    a `CachedLM` serving the most tokens a second (`autopar.planning.throughput`). With
    `compression` (`autopar.values.compression`) the solver may compress. `progress` gets
    a message as each pass starts (prefixed `STAGE`) and the solver's progress lines.
    Warnings are issued once each, at the end, and kept in `warnings`. Raises
    `InfeasiblePlanError`, `OptimizerError`, `MicrobatchError`."""
    deadline = Deadline(check_time_limit(time_limit))
    sharded, prompt = _serving_options(model, example_inputs, training, outputs, prefill,
                                       objective)
    check_hand_strategy_names(hand_strategies, mesh, strategy, microbatches=microbatches,
                              pipeline=pipeline, constraints=constraints)
    symbolic = dynamic_shapes is not None and microbatches == "auto"  # no divisors to try
    options = dict(microbatches=1 if symbolic else microbatches, model_name=type(model).__name__,
                   memory_budget=memory_budget, constraints=constraints,
                   fold_layers=fold_layers, seed=seed, hand_strategies=hand_strategies,
                   strategy=strategy, recompute=recompute, pipeline=pipeline,
                   optimizer=optimizer_state(optimizer, master_weights=master_weights),
                   progress=progress, compression=check_compression(compression, model))
    plan_at = functools.partial(_plan_at, mesh=mesh, dynamic_shapes=dynamic_shapes,
                                training=training, sharded=sharded, options=options)
    with _warned_once() as raised:
        planner = plan_at if objective == "latency" else functools.partial(
            _most_tokens, plan_at=plan_at, options=options)
        made = planner(model, tuple(example_inputs), deadline, prompt)
    return dataclasses.replace(made, warnings=_merge_warnings(made.warnings, raised))


def _serving_options(model: nn.Module, example_inputs: tuple, training: object,
                     outputs: object, prefill: object, objective: object
                     ) -> tuple[bool, int | None]:
    """Whether the outputs stay sharded and the prompt length to plan a prefill for, after
    checking `training`, `outputs`, `prefill` and `objective` (`PlanningError`)."""
    sharded = check_outputs(outputs, check_training(training))
    prompt = check_prefill(prefill, example_inputs, training)
    check_objective(objective, training, model, example_inputs)
    return sharded, prompt


def _plan_at(module: nn.Module, inputs: tuple, within: Deadline, prompt: int | None, *,
             mesh: Mesh, dynamic_shapes, training: bool, sharded: bool,
             options: Mapping) -> Plan:
    """`module` captured at `inputs` and planned within `within`, with the prefill of
    `prompt` tokens when given: one planning of `plan`'s, with its `options`."""
    gm = _traced(module, inputs, dynamic_shapes, training, sharded, options["progress"])
    return plan_model(module, gm, inputs, mesh, deadline=within, prefill=prompt, **options)


def _most_tokens(model: nn.Module, example_inputs: tuple, deadline: Deadline,
                 prompt: int | None,
                 plan_at: Callable[[nn.Module, tuple, Deadline, int | None], Plan],
                 options: Mapping[str, object]) -> Plan:
    """The throughput search of `autopar.planning.throughput` over `model` (a `CachedLM`)
    at larger batches, `plan_at(module, inputs, deadline, prompt)` planning each, the
    whole search's time recorded; the prefill planned for the batch kept only."""
    ids, position = example_inputs

    def inputs_of(batch: int) -> tuple:
        return (torch.zeros(batch, 1, dtype=ids.dtype, device=ids.device), position)

    def plan_batch(batch: int, within: Deadline) -> Plan:
        with model.resized(batch) as module:
            return plan_at(module, inputs_of(batch), within, None)

    def finish(made: Plan, batch: int) -> Plan:
        made = dataclasses.replace(made, solver=dataclasses.replace(
            made.solver, planning_s=deadline.spent(), time_limit_s=deadline.seconds))
        if prompt is None:
            return made
        with model.resized(batch) as module:
            return prefilled(made, module, inputs_of(batch), prompt, deadline.seconds,
                             options)

    return most_tokens(plan_batch, ids.shape[0], deadline, finish)


def _traced(model: nn.Module, example_inputs: tuple, dynamic_shapes, training: bool,
            sharded: bool, progress: Callable[[str], None] | None) -> fx.GraphModule:
    """`model` captured at `example_inputs`, its outputs marked as the caller takes them
    (`leave_outputs_sharded` where `sharded`), and annotated."""
    say = progress or (lambda message: None)
    say(f"{STAGE} capture")
    gm = capture(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes,
                 training=training)
    gm = leave_outputs_sharded(gm) if sharded else gm
    say(f"{STAGE} annotate")
    return annotate(gm)


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
               time_limit: float = TIME_LIMIT, deadline: Deadline | None = None,
               prefill: int | None = None, **options) -> Plan:
    """`layout.plan_layout`'s plan within `deadline` (by default `time_limit` seconds from
    now), recording the example inputs it is for, the time it took, and the warnings
    raised while planning once each (`_warned_once`); a list of `memory_budget`s, one per
    device, binds at its least (`graph.device_budget`); with `prefill`, a decode program's
    plan with that prefill's (`autopar.planning.prefill`), planned next with a limit of its
    own. A mesh whose devices differ along an axis gets pieces sized to their speed there
    (`autopar.planning.shares`), unless it has shares already."""
    if deadline is None:
        deadline = Deadline(check_time_limit(time_limit))
    mesh = speed_shares(gm, mesh)
    training = is_training(gm)
    if "memory_budget" in options:  # one number: a list's least (one budget per device)
        options["memory_budget"] = device_budget(options["memory_budget"], mesh)
    if not training:
        microbatches, pipeline = _forward_only_layout(microbatches, pipeline)
    with _warned_once() as raised:
        made = plan_layout(model, gm, example_inputs, mesh, microbatches=microbatches,
                           pipeline=pipeline, time_limit=deadline.seconds, deadline=deadline,
                           **options)
    if not training:
        made = dataclasses.replace(made, training=False, optimizer=FORWARD_ONLY,
                                   outputs="sharded" if outputs_sharded(gm) else "whole",
                                   **_kv_cache(gm, made))
    solver = dataclasses.replace(
        made.solver, planning_s=deadline.spent(), time_limit_s=deadline.seconds,
        cut_short=deadline.passed() and made.solver.status != "optimal"
        and made.solver.gap > PLANNER_GAP)
    made = dataclasses.replace(made, inputs=input_signature(example_inputs),
                               graph=graph_digest(gm), solver=solver,
                               warnings=_merge_warnings(made.warnings, raised))
    if prefill is None:
        return made
    return prefilled(made, model, example_inputs, prefill, deadline.seconds, options, gm=gm)


def prefilled(decode: Plan, model: nn.Module, example_inputs: tuple, prompt: int,
              time_limit: float, options: Mapping[str, object],
              gm: fx.GraphModule | None = None) -> Plan:
    """`decode` (of `model` at `example_inputs`, captured as `gm` when given) with its
    prefill of `prompt` tokens, planned as `compile_prefill` compiles it, after the decode
    plan (whose `planning_s` it is not in), with a `time_limit` of its own and `options`'
    budget, seed and progress; where the prefill weighs in a request, also the two planned
    as one problem (`autopar.planning.prefill`)."""
    passed = {k: v for k, v in options.items() if k in ("memory_budget", "seed", "progress")}

    def both(inputs: tuple, steps: int, share: float) -> Plan | None:
        prefill_gm = _traced(model, inputs, None, False, False, passed.get("progress"))
        return planned_together(decode, gm, prefill_gm, inputs, steps, share * time_limit,
                                passed)

    def forward(inputs: tuple, pins: Mapping[str, str], layout: Pipeline | bool,
                share: float) -> Plan:
        return plan(model, decode.mesh, inputs, training=False, constraints=pins,
                    pipeline=layout, time_limit=share * time_limit, **passed)

    return with_prefill(decode, prompt, example_inputs, forward,
                        both if gm is not None else None)


def planned_together(decode: Plan, gm: fx.GraphModule, prefill_gm: fx.GraphModule,
                     prefill_inputs: tuple, steps: int, time_limit: float,
                     options: Mapping[str, object]) -> Plan | None:
    """`decode` (a plan of `gm`) replanned with its prefill (`prefill_gm`, captured at
    `prefill_inputs`) as one problem (`autopar.planning.joint`): the decode plan, marked as
    `decode` is, with its prefill's latency and peak; None when the solve found none."""
    planned = plan_both(gm, prefill_gm, decode.mesh, steps=steps,
                        memory_budget=decode.memory_limit_bytes,
                        charges=Background(decode.solver.exposed_reductions,
                                           decode.solver.exposed_gathers),
                        time_limit=time_limit, seed=int(options.get("seed", 0)),
                        model_name=decode.model, progress=options.get("progress"))
    if planned is None:
        return None
    together, prefill = planned
    return dataclasses.replace(
        together, training=False, optimizer=FORWARD_ONLY, outputs=decode.outputs,
        **_kv_cache(gm, together), inputs=decode.inputs, graph=decode.graph,
        warnings=decode.warnings, hand_strategies=decode.hand_strategies,
        solver=dataclasses.replace(together.solver, planning_s=decode.solver.planning_s,
                                   time_limit_s=decode.solver.time_limit_s),
        prefill_tokens=int(prefill_inputs[0].shape[1]), prefill_s=prefill.step_time_s,
        prefill_peak_bytes=prefill.peak_memory_bytes, placed_for="both")


def _kv_cache(gm: fx.GraphModule, made: Plan) -> dict:
    """A forward-only plan's KV cache: the buffers its forward writes in place, their bytes
    per device (the plan's pieces; of a pipeline, on the pipeline rank holding the most)
    and, laid out as transformers' caches (sequences, heads, positions, head dim), the
    tokens they hold."""
    specs = {n.name: n.meta[TENSOR] for n in written_buffers(gm)}
    if not specs:
        return {}
    ranks = made.pipeline.ranks if made.pipeline else 1
    held_by: dict[int, float] = defaultdict(float)  # pipeline rank -> its stages' cache bytes
    for node in made.nodes:
        if node.name in specs:
            held_by[rank_of(node.stage, ranks)] += node.memory_bytes
    held = max(held_by.values(), default=0.0)
    # (sequences, positions) of each 4-d buffer: one pair when all agree.
    shapes = {(spec.shape[0], spec.shape[2]) for spec in specs.values() if len(spec.shape) == 4}
    tokens = shapes.pop() if len(shapes) == 1 else (0, 0)
    return {"kv_cache_bytes": float(held), "kv_cache_tokens": int(tokens[0] * tokens[1])}


def check_training(training: object) -> bool:
    """`training` itself; `PlanningError` unless it is a bool."""
    if not isinstance(training, bool):
        raise PlanningError("training must be True (plan a training step) or False (plan "
                            "the forward alone, to serve the model)",
                            expected="a bool", got=repr(training),
                            fix="pass training=False for inference, or leave the default")
    return training


def check_outputs(outputs: object, training: bool) -> bool:
    """Whether the plan may leave the outputs split ("sharded"); `PlanningError` unless
    `outputs` is "whole" or, for a forward-only plan, "sharded"."""
    if outputs == "whole" or (outputs == "sharded" and not training):
        return outputs == "sharded"
    raise PlanningError("outputs must be 'whole', or 'sharded' for a forward-only plan",
                        expected="'whole' or, with training=False, 'sharded'",
                        got=f"outputs={outputs!r}, training={training!r}",
                        fix="outputs='sharded' with training=False (a training step returns "
                            "its loss whole), or leave the default")


def _forward_only_layout(microbatches: int | str, pipeline: Pipeline | str | bool
                         ) -> tuple[int, bool]:
    """The layout of a forward-only plan: one batch, no pipeline; `PipelineError` or
    `MicrobatchError` when the caller asked for a pipeline or micro-batches."""
    if microbatches not in ("auto", 1):
        raise MicrobatchError("a forward-only plan (training=False) runs the batch whole",
                              expected="microbatches='auto' or 1", got=repr(microbatches),
                              fix="pass a smaller batch per call instead")
    return 1, pipeline


def check_time_limit(time_limit: object) -> float:
    """`time_limit` as seconds; `ProblemFormatError` (as the solver says of its own) unless
    it is a positive number."""
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) \
            or not time_limit > 0 or time_limit == float("inf"):
        raise ProblemFormatError(
            "time_limit must be a positive number of seconds",
            expected=f"e.g. {TIME_LIMIT:g} (the default)", got=repr(time_limit),
            fix="pass time_limit=<seconds the whole planning may take>")
    return float(time_limit)


@contextmanager
def _warned_once() -> Iterator[list[str]]:
    """Hold back the warnings raised inside; at the end issue each distinct one once (every
    solve finds the strategies again, and warns again) and append its message to the list
    yielded, for the plan's `warnings` (`_merge_warnings`)."""
    caught: list[warnings.WarningMessage] = []
    raised: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield raised
    finally:
        for category, message in dict.fromkeys((w.category, str(w.message)) for w in caught):
            # 4: past this generator and contextlib, to the caller of the function using it.
            warnings.warn(message, category, stacklevel=4)
            raised.append(message)


def _merge_warnings(kept: tuple[str, ...], raised: list[str]) -> tuple[str, ...]:
    """The plan's warnings, each once, then those raised while planning that they don't
    already say (the strategy pass's "no sharding rule for a, b: replicated" is the plan's
    "no sharding rule for a: kept replicated" per op)."""
    merged = list(dict.fromkeys(kept))
    for message in raised:
        if message.startswith(NO_RULE):
            ops = message.removeprefix(NO_RULE).rsplit(": ", 1)[0].split(", ")
            if all(any(w.startswith(f"{NO_RULE}{op}:") for w in merged) for op in ops):
                continue
        if message not in merged:
            merged.append(message)
    return tuple(merged)


