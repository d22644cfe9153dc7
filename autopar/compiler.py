"""`compile`: a model and a mesh -> this rank's `ParallelModule`.

It reads as the pipeline of docs/DESIGN.md: capture, annotate, plan (strategies, problem, solve,
extract; done once, on rank 0, and sent to the others so that every rank runs the same
plan whatever the solver's time limits did), lower, and the runtime module.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.distributed.device_mesh import DeviceMesh

from autopar.errors import (
    CaptureError,
    InputMismatchError,
    MeshError,
    PlanFormatError,
    PlanningError,
)
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import (
    CALL_SPEC,
    CONSTANTS,
    LOSS,
    MUTATED,
    capture,
    leave_outputs_sharded,
)
from autopar.passes.layout.split_microbatches import (
    batch_size,
    loss_weights,
    split_microbatches,
)
from autopar.passes.layout.split_stages import find_units, split_stages
from autopar.passes.lowering.lower import lower
from autopar.passes.strategies.find_strategies import is_decision
from autopar.planning.deadline import Deadline
from autopar.planning.entry import (
    TIME_LIMIT,
    check_outputs,
    check_time_limit,
    check_training,
    graph_digest,
    input_signature,
    plan_model,
)
from autopar.planning.microbatches import micro_graph
from autopar.runtime.collectives import RankContext
from autopar.runtime.compile_on_call import CompileOnCall
from autopar.runtime.errors import ProcessGroupError
from autopar.runtime.groups import device_mesh
from autopar.runtime.materialize import local_pieces, state_slots
from autopar.runtime.parallel_module import ParallelModule
from autopar.runtime.pipeline import PipelinedModule, boundary_examples, stage_user_keys
from autopar.values.compression import check_compression
from autopar.values.mesh import Mesh
from autopar.values.microbatch import ACCUMULATE, SUMMED, BatchSplit
from autopar.values.pipeline import Pipeline
from autopar.values.plan import Plan
from autopar.values.specs import NAMES, ROLE, TENSOR, TensorSpec


def check_plan(plan: Plan, gm: fx.GraphModule, example_inputs: tuple, mesh: Mesh,
               training: bool = True, outputs: str = "whole") -> None:
    """Raise the error naming the first thing `plan` was not made for: training or
    inference (`PlanFormatError`), the mesh (`MeshError`), the example inputs' shapes and
    dtypes (`InputMismatchError`), or the model captured as `gm` (`PlanFormatError`: a node
    missing from the plan, or another op there). Cheap, and run where the plan is given,
    before any rank starts."""
    if plan.training != training:
        made, asked = (("a training step", "inference") if plan.training
                       else ("inference", "a training step"))
        raise PlanFormatError(f"the plan was made for {made}, not {asked}",
                              expected=f"a plan made with training={training}",
                              got=f"a plan made with training={plan.training}",
                              fix=f"plan again with training={training}, or compile with "
                                  f"training={plan.training}")
    if plan.outputs != outputs:
        raise PlanFormatError(f"the plan returns its outputs {plan.outputs}, not {outputs}",
                              expected=f"a plan made with outputs={outputs!r}",
                              got=f"a plan made with outputs={plan.outputs!r}",
                              fix=f"compile with outputs={plan.outputs!r}, or plan again")
    if plan.mesh.shape != mesh.shape or plan.mesh.axis_names != mesh.axis_names:
        raise MeshError("the plan was made for another mesh",
                        expected=f"a plan for mesh {mesh.describe()}",
                        got=f"a plan for {plan.mesh.describe()}",
                        fix="plan again for this mesh, or compile with the plan's mesh")
    given = input_signature(example_inputs)
    if plan.inputs and plan.inputs != given:
        where = next((i for i, (a, b) in enumerate(zip(plan.inputs, given)) if a != b),
                     min(len(plan.inputs), len(given)))
        raise InputMismatchError(
            f"the plan was made for other inputs (input {where} differs)",
            expected=f"inputs {', '.join(plan.inputs)}", got=f"inputs {', '.join(given)}",
            fix="plan again with these inputs, or pass inputs of the planned shapes")
    if plan.microbatches > 1 or plan.pipeline is not None or plan.graph == graph_digest(gm):
        # A plan of micro-batches is one micro-batch's graph, a pipelined one its stages'
        # graphs: each is checked when lowered.
        return
    planned = {node.name: node.op for node in plan.nodes}
    for node in gm.graph.nodes:
        if not is_decision(node):
            continue
        op = str(node.target) if node.op == "call_function" else node.op
        if planned.get(node.name) != op:
            raise PlanFormatError(
                f"the plan was made for another model: node {node.name!r} ({op}) of "
                "this model is " + ("missing from it" if node.name not in planned
                                    else f"{planned[node.name]} in it"),
                expected=f"a plan of this model ({sum(map(is_decision, gm.graph.nodes))} "
                         "decisions)",
                got=f"a plan of {plan.model} ({len(plan.nodes)} decisions)",
                fix="plan again for this model: autopar plan FILE.py --out plan.json, or "
                    "drop --plan / plan= to plan on the fly")
    if plan.graph:
        raise PlanFormatError(
            "the plan was made for a model with the same ops but other tensor shapes "
            "(parameters, buffers or intermediate sizes)",
            expected=f"a plan of this graph (digest {graph_digest(gm)})",
            got=f"a plan of {plan.model} (digest {plan.graph})",
            fix="plan again for this model and configuration")


def _agreed(make: Callable[[], Plan], device: DeviceMesh | None) -> Plan:
    """Rank 0's plan, on every rank. Whatever rank 0 raises while planning is raised on
    every rank at once (an error that can't be sent as itself as a `PlanningError` with
    its message), rather than leaving the others waiting for a plan until the process
    group times out."""
    if device is None or dist.get_world_size() == 1:
        return make()
    payload: list = [None]
    if dist.get_rank() == 0:
        try:
            payload = [("plan", make().to_dict())]
        except Exception as error:  # every rank must hear of it, whatever it is
            payload = [("error", error if _sendable(error) else PlanningError(
                "planning failed on rank 0", got=f"{type(error).__name__}: {error}",
                fix="see rank 0's traceback"))]
            dist.broadcast_object_list(payload, src=0)
            raise
    dist.broadcast_object_list(payload, src=0)
    kind, value = payload[0]
    if kind == "error":
        raise value
    return Plan.from_dict(value)


def _sendable(error: Exception) -> bool:
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any failure to round-trip means "not as itself"
        return False
    return True


def _rank_device(mesh: DeviceMesh | None) -> torch.device:
    """Where this rank computes: its GPU under NCCL, else the CPU."""
    if mesh is not None and mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def compile(model: nn.Module, mesh: Mesh | DeviceMesh, example_inputs: tuple | None = None,
            *, plan: Plan | None = None, memory_budget: float | None = None,
            time_limit: float = TIME_LIMIT, constraints: Mapping[str, str] | None = None,
            seed: int = 0, optimizer: object = None, compression: object = None,
            master_weights: torch.dtype | None = None, microbatches: int | str = "auto",
            pipeline: Pipeline | str | bool = "auto", training: bool = True,
            outputs: str = "whole", hardware: str | None = None, replan: bool = True,
            progress: Callable[[str], None] | None = None) -> ParallelModule | CompileOnCall:
    """This rank's `ParallelModule` of `model` split over `mesh` (see docs/DESIGN.md's API).

    `mesh` is an `autopar.Mesh`, or a torch `DeviceMesh` the caller already made (its
    shape and dim names; the hardware profile `hardware`, else taken from its device
    type: see `mesh_of`). Without `example_inputs`, the model is compiled at its first
    call from that call's inputs (`autopar.runtime.compile_on_call.CompileOnCall`); a
    later call with other shapes compiles again, or raises `InputMismatchError` with
    `replan=False` or a given `plan`.

    Collective: every rank of the default process group calls it with the same model
    (same initial values), mesh and example inputs; the process group's world size must
    be `mesh.size` (a mesh of one device needs no process group). Without `plan`, rank 0
    plans with `autopar.plan`'s options and the others receive its plan; with one, it must
    have been made for this model, these input shapes and this mesh. The model may live
    on the meta device (with meta example inputs; the compiled model is then called with
    real tensors of the same shapes): each rank initialises only its own pieces (see
    `autopar.runtime.materialize`). `optimizer` and `master_weights` are what the plan's
    memory counts per parameter element (see `autopar.plan`); train a bfloat16 model with
    `master_weights=torch.float32` through `autopar.master_weights`, which keeps exactly that.
    `microbatches`, `pipeline`, `compression` are `autopar.plan`'s; a plan of several
    micro-batches runs each call as that many (`autopar.runtime.microbatches`), a pipelined
    plan runs this rank's stages under torch's schedule (`autopar.runtime.pipeline`); a
    forced pipeline of a model whose ops mix samples trains it by gradient accumulation
    (`split_microbatches`'s ACCUMULATED, which the plan's warnings state).
    `training=False` (and `outputs`) compile the model as it serves (`autopar.plan`'s): a
    call runs the forward alone, without autograd ("sharded" outputs come back DTensors).

    Raises `ProcessGroupError` (no process group, or a world size that is not the mesh's),
    `MeshError`/`PlanFormatError` (a plan of another mesh or model), `autopar.plan`'s errors.
    """
    device = mesh if isinstance(mesh, DeviceMesh) else None
    mesh = mesh_of(mesh, hardware)
    if device is None and (mesh.size > 1 or dist.is_initialized()):
        device = device_mesh(mesh)
    if example_inputs is None:
        options = dict(plan=plan, memory_budget=memory_budget, time_limit=time_limit,
                       seed=seed, optimizer=optimizer, master_weights=master_weights,
                       microbatches=microbatches, pipeline=pipeline, training=training,
                       outputs=outputs, compression=compression, progress=progress)
        return _on_first_call(model, mesh, device, constraints, options,
                              replan=replan and plan is None)
    deadline = Deadline(check_time_limit(time_limit))  # capture included
    gm = _captured(model, example_inputs, training, outputs)
    if plan is not None:
        check_plan(plan, gm, tuple(example_inputs), mesh, training, outputs)
    chosen = _agreed(lambda: plan or plan_model(
        model, gm, tuple(example_inputs), mesh, microbatches=microbatches,
        model_name=type(model).__name__, memory_budget=memory_budget,
        deadline=deadline, constraints=constraints, seed=seed, optimizer=optimizer,
        master_weights=master_weights, pipeline=pipeline, progress=progress,
        compression=check_compression(compression, model)), device)
    return assemble(model, gm, chosen, device, tuple(example_inputs))


def _captured(model: nn.Module, example_inputs: object, training: bool,
              outputs: str = "whole") -> fx.GraphModule:
    """`model`'s step (or forward, without `training`) captured at `example_inputs` and
    annotated, its outputs marked as the caller takes them (`check_outputs`);
    `CaptureError` when they are not a tuple."""
    if not isinstance(example_inputs, tuple):
        raise CaptureError("example_inputs must be the positional arguments of model.forward",
                           expected="a tuple", got=type(example_inputs).__name__,
                           fix="wrap them in a tuple, e.g. (x,)")
    sharded = check_outputs(outputs, check_training(training))
    gm = annotate(capture(model, tuple(example_inputs), training=training))
    return leave_outputs_sharded(gm) if sharded else gm


def _on_first_call(model: nn.Module, mesh: Mesh, device: DeviceMesh | None,
                   constraints: Mapping[str, str] | None, options: dict, *,
                   replan: bool) -> CompileOnCall:
    """`model` compiled at its first call (`CompileOnCall`), with `compile`'s other
    `options`, on `device` (`mesh` when None); each compile adds the pins `CompileOnCall`
    passes to `constraints`."""

    def compile_for(inputs: tuple, pinned: dict[str, str] | None) -> ParallelModule:
        # The same DeviceMesh for every compile: its process groups are made once.
        return compile(model, device or mesh, inputs, hardware=mesh.hardware,
                       constraints={**(constraints or {}), **(pinned or {})} or None,
                       **options)

    return CompileOnCall(model, compile_for, replan=replan)


def assemble_pipeline(model: nn.Module, gm: fx.GraphModule, plan: Plan,
                      device: DeviceMesh | None, example_inputs: tuple) -> PipelinedModule:
    """This rank's `PipelinedModule` of a pipelined `plan`: the model captured at one
    micro-batch, cut where the plan cut it, and the stages of this pipeline rank lowered on
    its coordinate of the other axes. Not collective, except for the process groups of
    the sub-mesh (every rank makes them)."""
    record = plan.pipeline
    assert record is not None
    if device is None:
        raise ProcessGroupError("a pipelined plan runs on several processes",
                                expected=f"a process group of {plan.mesh.size} ranks",
                                got="none", fix="start the ranks with autopar.launch or torchrun")
    axis = plan.mesh.axis_index(record.axis)
    others = tuple(n for n in plan.mesh.axis_names if n != record.axis)
    inner = device[others] if others else None
    coordinate = tuple(device.get_coordinate())
    rank = coordinate[axis]
    inner_coordinate = tuple(c for i, c in enumerate(coordinate) if i != axis) or (0,)
    context = RankContext(inner) if inner is not None else None
    here = _rank_device(device)
    split, micro, weights = _micro_step(model, gm, plan, example_inputs)
    units = find_units(micro)
    stages = split_stages(micro, units, tuple(s.units[0] for s in record.stages[1:]))
    model_inputs = [n.name for n in micro.graph.nodes
                    if n.op == "placeholder" and n.meta.get(ROLE) == "input"]
    local, state, examples = [], {}, {}
    for stage in stages:
        if stage.index % record.ranks != rank:
            continue
        stage_plan = plan.stage_plan(stage.index)
        program = lower(stage.module, stage_plan, inner_coordinate, context, here)
        local.append((stage.index, program, stage_user_keys(stage.module, model_inputs)))
        examples[stage.index] = boundary_examples(stage.module, stage_plan, inner_coordinate,
                                                  here, training=plan.training)
        state.update({slot.names[0]: slot for slot in program.state})
    read_anywhere = {name for stage in stages for n in stage.module.graph.nodes
                     if n.op == "placeholder" for name in n.meta.get(NAMES, ())}
    slots = tuple(slot for slot in state_slots(model, tuple(state.values()), len(
        record.sub_mesh.shape)) if slot.names[0] in state or not read_anywhere & set(slot.names))
    pieces = local_pieces(model, slots, micro.meta[CONSTANTS], record.sub_mesh.shape,
                          inner_coordinate, here, record.sub_mesh.shares)
    trained = dict(model.named_parameters(remove_duplicate=False))
    shared = tuple((t.tensor, int(t.nbytes) // trained[t.tensor].element_size(),
                    trained[t.tensor].dtype) for t in record.transfers if t.kind == "all_reduce")
    return PipelinedModule(plan, stages=local, examples=examples, slots=slots, pieces=pieces,
                           persistent=set(model.state_dict(keep_vars=True)), device=device,
                           inner=inner, context=context, here=here, inputs=tuple(_batch_inputs(gm)),
                           call_spec=gm.meta[CALL_SPEC], split=split, weights=weights,
                           shared=shared, loss_index=micro.meta.get(LOSS, 0),
                           returns=None if plan.training else _returned(gm))


def _micro_step(model: nn.Module, gm: fx.GraphModule, plan: Plan, example_inputs: tuple
                ) -> tuple[BatchSplit, fx.GraphModule, Callable[[list[list]], list[float]]]:
    """How a pipelined plan's step is cut: the split, the graph of one micro-batch and the
    micro-batches' loss weights (a forward-only plan has no loss: ones)."""
    count = plan.pipeline.microbatches
    if not plan.training:
        split = split_microbatches(gm, count) if count > 1 else BatchSplit(
            1, batch_size(gm) or 1, tuple(False for _ in _batch_inputs(gm)), SUMMED)
        micro = gm if count == 1 else micro_graph(model, example_inputs, split, training=False)
        return split, micro, lambda inputs: [1.0] * count
    # A pipelined plan of a step that mixes samples was asked for (auto pipelines only steps
    # that split exactly), so it accumulates as planned; an exact step splits as before.
    split = split_microbatches(gm, plan.pipeline.microbatches, mixing=ACCUMULATE)
    micro = gm if split.microbatches == 1 else micro_graph(model, example_inputs, split)
    return split, micro, loss_weights(split, micro)


def _returned(gm: fx.GraphModule) -> tuple[TensorSpec | None, ...]:
    """A forward-only graph's flat outputs as the last pipeline stage broadcasts them: each
    tensor's spec (None for a leaf that is not a tensor)."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    return tuple(v.meta.get(TENSOR) if isinstance(v, fx.Node)
                 and isinstance(v.meta.get(TENSOR), TensorSpec) else None
                 for v in output.args[0])


def _batch_inputs(gm: fx.GraphModule) -> list:
    """The whole batch's flat user inputs, as the graph captured at it describes them."""
    return [n.meta.get(TENSOR) if isinstance(n.meta.get(TENSOR), TensorSpec)
            else n.meta.get("val") for n in gm.graph.nodes
            if n.op == "placeholder" and n.meta.get(ROLE) == "input"]


def mesh_of(mesh: Mesh | DeviceMesh, hardware: str | None = None) -> Mesh:
    """`mesh` as an `autopar.Mesh`: itself, or a torch DeviceMesh's shape and dim names
    (`d0`, `d1`, ... when it has none) on `hardware`, by default the profile of its device
    type ("cpu"; for "cuda" the profile whose name the GPU's name contains)."""
    if isinstance(mesh, Mesh):
        return mesh if hardware is None else Mesh(mesh.shape, mesh.axis_names,
                                                  hardware=hardware)
    if not isinstance(mesh, DeviceMesh):
        raise MeshError("compile needs a mesh", expected="an autopar.Mesh or a torch "
                        "DeviceMesh", got=type(mesh).__name__,
                        fix="autopar.Mesh((2, 2), ('dp', 'tp'))")
    shape = tuple(mesh.mesh.shape)
    names = mesh.mesh_dim_names or tuple(f"d{i}" for i in range(len(shape)))
    return Mesh(shape, names, hardware=hardware or _hardware_of(mesh.device_type))


def _hardware_of(device_type: str) -> str:
    if device_type == "cpu":
        return "cpu"
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else device_type
    for profile in ("h100-sxm", "a100-sxm"):
        if profile.split("-")[0] in name.lower():
            return profile
    raise MeshError("no hardware profile for the DeviceMesh's devices",
                    expected="an H100 or A100, or hardware= naming a profile or JSON file",
                    got=f"{device_type} ({name})",
                    fix="autopar.compile(model, device_mesh, hardware='path/to/profile.json')")


def assemble(model: nn.Module, gm: fx.GraphModule, plan: Plan,
             device: DeviceMesh | None, example_inputs: tuple = ()) -> ParallelModule:
    """The `ParallelModule` of `model` for `plan`, from its captured and annotated graph
    `gm`, on this rank's `device` mesh (None on a mesh of one device). A plan of several
    micro-batches lowers `model` captured at one micro-batch of `example_inputs`. Not
    collective."""
    if plan.pipeline is not None:
        return assemble_pipeline(model, gm, plan, device, example_inputs)
    coordinate = tuple(device.get_coordinate()) if device is not None else (0,) * plan.mesh.ndim
    context = RankContext(device) if device is not None else None
    here = _rank_device(device)
    split = weights = None
    if plan.microbatches > 1:
        split = split_microbatches(gm, plan.microbatches)
        gm = micro_graph(model, example_inputs, split)
        weights = loss_weights(split, gm)
    program = lower(gm, plan, coordinate, context, here)
    slots = state_slots(model, program.state, plan.mesh.ndim)
    pieces = local_pieces(model, slots, gm.meta[CONSTANTS], plan.mesh.shape, coordinate, here,
                          plan.mesh.shares)
    return ParallelModule(program, plan, slots=slots, pieces=pieces,
                          persistent=set(model.state_dict(keep_vars=True)), context=context,
                          coordinate=coordinate, call_spec=gm.meta[CALL_SPEC],
                          mutated=gm.meta[MUTATED], split=split, weights=weights)
