"""The "Megatron 3D" hand strategy: tensor parallel inside nodes, pipeline across, data
parallel over the rest, costed by the same pipeline planner and cost model as the solver's
plan (`autopar.planning.pipeline.plan`).

The pipeline axis is the one named "pp", else the outermost axis that crosses nodes (whose
link is not the innermost level). Every other axis inside a node plays "tp" (Megatron's
column and row splits), every other one "dopt" (data parallel with Megatron-LM's
distributed optimizer, `--use-distributed-optimizer`, without which a large model's
replicated master weights and optimizer states overflow a device:
`autopar.passes.strategies.restrict`); activations outside the matmuls are recomputed
selectively, as Megatron-LM does for large models. The
micro-batches, the schedule and the stage cuts are chosen as for the solver's pipelines,
within the memory budget when any fits (else without a limit, the record then not fitting).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.fx as fx
from torch import nn

from autopar.costs.optimizer_state import OptimizerState
from autopar.errors import InfeasiblePlanError, MicrobatchError, PipelineError
from autopar.passes.capturing.capture import is_training
from autopar.passes.problem.edge_cache import EdgeCaches
from autopar.passes.problem.fold_depth import fold_depth
from autopar.passes.strategies.find_strategies import find_strategies
from autopar.passes.strategies.offer_recompute import offer_recompute
from autopar.passes.strategies.offer_whole_gradient import offer_whole_gradient
from autopar.passes.strategies.restrict import restrict
from autopar.planning.deadline import Deadline
from autopar.planning.graph import plan_table, refined, screened
from autopar.planning.hand_strategies import MEGATRON_3D, HandStrategy, missing_record, plan_record
from autopar.planning.microbatches import MicroBatches
from autopar.planning.pipeline.plan import plan_pipeline
from autopar.values.mesh import Mesh
from autopar.values.pipeline import Pipeline
from autopar.values.plan import HandStrategyRecord, Plan


def pipeline_axis_3d(mesh: Mesh) -> int | None:
    """The axis Megatron 3D pipelines over: "pp", else the outermost one across nodes."""
    if "pp" in mesh.axis_names:
        return mesh.axis_index("pp")
    inner = mesh.hardware.links[0].name
    return next((i for i in range(mesh.ndim)
                 if mesh.axis_links[i].name != inner and mesh.shape[i] > 1), None)


def megatron_3d(model: nn.Module, gm: fx.GraphModule, example_inputs: tuple, mesh: Mesh, *,
                memory_budget: float, time_limit: float, fold_layers: bool, seed: int,
                optimizer: OptimizerState, micro: MicroBatches | None = None,
                edge_caches: EdgeCaches | None = None,
                progress: Callable[[str], None] | None = None,
                deadline: Deadline | None = None) -> tuple[HandStrategyRecord, Plan | None]:
    """The Megatron 3D record and its plan (None when it doesn't apply or fit, a slow one
    that fits counting); `micro` (or its own), `edge_caches`, `deadline`: the call's."""
    axis = pipeline_axis_3d(mesh) if mesh.ndim >= 2 else None
    if axis is None:
        strategy = HandStrategy(MEGATRON_3D, "tensor parallel inside nodes, pipeline across, data "
                                "parallel over the rest", None,
                                note="needs an axis named pp or one across nodes, and another")
        return missing_record(strategy, strategy.note), None
    strategy = _strategy(mesh, axis, training=is_training(gm))
    roles = strategy.roles

    def plan_stage(graph: fx.GraphModule, inner: Mesh, *, memory_budget: float | None,
                   microbatches: int, in_flight: int, constraints=None,
                   refining: Plan | None = None) -> Plan:
        if fold_layers:
            graph = fold_depth(graph, keep=frozenset(constraints or ()))
        table = offer_recompute(graph, find_strategies(graph, inner))
        if microbatches > 1:
            table = offer_whole_gradient(table)
        if constraints:
            from autopar.passes.strategies.constrain import constrain

            table = constrain(graph, table, inner, constraints)
        restricted = restrict(graph, table, inner, roles, strategy.recompute).table
        solve = (screened({"time_limit": time_limit}) if refining is None
                 else refined({"time_limit": time_limit}, refining))
        return plan_table(graph, restricted, inner, model_name=type(model).__name__,
                          memory_budget=memory_budget, time_limit=solve["time_limit"],
                          fold_layers=fold_layers, seed=seed, optimizer=optimizer,
                          microbatches=microbatches, in_flight=in_flight, least_memory=False,
                          fallback=True, overlap_rounds=solve["overlap_rounds"],
                          charges=solve.get("charges"),
                          edge_cache=edge_caches.of(inner) if edge_caches else None,
                          deadline=deadline, screening=solve.get("screening", False))

    request = Pipeline(axis=mesh.axis_names[axis])
    for budget in (memory_budget, None):
        try:
            plan = plan_pipeline(gm, mesh, request,
                                 plan_stage=plan_stage, memory_budget=budget,
                                 micro=micro or MicroBatches(model, example_inputs, gm),
                                 progress=progress, deadline=deadline)
        except InfeasiblePlanError:
            continue
        except (PipelineError, MicrobatchError) as error:
            return missing_record(strategy, error.what), None
        fits = plan.peak_memory_bytes <= memory_budget
        record = plan_record(strategy, plan, memory_budget, _describe(plan))
        return record, plan if fits else None
    return missing_record(strategy, "no plan within this restriction"), None


def _strategy(mesh: Mesh, axis: int, *, training: bool) -> HandStrategy:
    """The roles of the axes besides the pipeline's `axis`: "tp" inside a node, else data
    parallel, with the distributed optimizer and selective recompute in a `training` step
    (Megatron-LM's recipe); a forward (serving's rule of thumb, as vLLM's guide gives it:
    tensor parallel = the GPUs of a node, pipeline = the nodes) replicates the model over
    the data-parallel axes."""
    inner_link = mesh.hardware.links[0].name
    others = [i for i in range(mesh.ndim) if i != axis]
    parallel = "dopt" if training else "dp"
    roles = tuple("tp" if mesh.axis_links[i].name == inner_link else parallel for i in others)
    described = ", ".join(f"{role} over {mesh.axis_names[i]}" for i, role in zip(others, roles))
    if not training:
        return HandStrategy(MEGATRON_3D, f"pipeline over {mesh.axis_names[axis]}, {described}",
                            roles)
    return HandStrategy(MEGATRON_3D, f"pipeline over {mesh.axis_names[axis]}, {described}"
                        ", selective recompute", roles, recompute="selective")


def _describe(plan: Plan) -> str:
    record = plan.pipeline
    assert record is not None
    return (f"{record.schedule}, {record.microbatches} micro-batches, "
            f"{len(record.stages)} stages, bubble {record.bubble:.0%}")
