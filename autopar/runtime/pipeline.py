"""`PipelinedModule`: one rank's stages of a pipelined plan, run by torch's schedules.

Each stage's graph (`autopar.passes.layout.split_stages`) is lowered for this rank's coordinate on
the other mesh axes (its own collectives on that sub-mesh) and wrapped in a torch
`PipelineStage` over the pipeline axis' process group; torch's schedule class
(`ScheduleGPipe`, `Schedule1F1B`, `ScheduleInterleaved1F1B`) runs the step: it cuts the
inputs into micro-batches, sends each stage's outputs to the next stage's rank and the
gradients back.

`pm(*inputs)` is called on every rank with the whole batch, as for any plan. It runs the
whole schedule, forwards and backwards, and returns the batch's loss on every rank, the
micro-batches' losses weighted as `split_microbatches` says (torch's `loss_fn` multiplies each by
its weight, which travels as the schedule's `target`; 1/m each for a model whose ops mix
samples, which a forced pipeline trains by gradient accumulation); `loss.backward()` then hands the
accumulated gradients to `.grad`, times the gradient it receives
(`autopar.runtime.microbatches.hand_over`). Every stage reads the user inputs it needs from
the call: torch passes them to every stage as keyword arguments, cut like the batch or
whole. The gradients of a weight two stages hold (a tied embedding) are summed over the
pipeline axis after the schedule; replicated parameters' all-reduces wait for the stage's
last micro-batch, as in a step of micro-batches (`GradientReducer.deferring`).

A forward-only plan's schedule has no loss and runs no backward: the batch goes through
the stages whole (one micro-batch), the last stage returns the model's tensor outputs and
`pm(*inputs)` broadcasts them from the last pipeline rank, so every rank returns them
whole, without autograd.

Counted on the rank's `CommCounter` besides the stages' own collectives: each boundary
tensor sent forward and each gradient sent back ("send" on the pipeline axis), the shared
weights' gradient all-reduces and the loss's (or the outputs') broadcast, matching
`Plan.comm_bytes(rank)`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining.microbatch import TensorChunkSpec, _Replicate
from torch.distributed.pipelining.schedules import get_schedule_class
from torch.utils import _pytree as pytree

from autopar.runtime.collectives import RankContext
from autopar.runtime.counter import CommCounter, tensor_bytes
from autopar.runtime.microbatches import hand_over
from autopar.runtime.parallel_module import (
    adopt_pieces,
    check_inputs,
    flatten_inputs,
    owner_of,
    register_pieces,
)
from autopar.runtime.pipeline_stage import StageModule, TorchStage
from autopar.runtime.program import RankProgram, StateSlot
from autopar.runtime.shards import chunk_of, gather_full
from autopar.values.microbatch import BatchSplit, micro_inputs
from autopar.values.pipeline import schedule_named
from autopar.values.placement import parse_placements
from autopar.values.plan import Plan
from autopar.values.specs import BOUNDARY, ROLE, TENSOR, TensorSpec


def _gather_once_per_backward(context: RankContext | None, splits_backward: bool) -> None:
    """Under a schedule that splits each backward into an input and a weight pass, keep a
    regathered parameter from the first pass to the second (`Regather.backward_passes`)."""
    if context is not None and splits_backward:
        context.regather.backward_passes = 2


class PipelinedModule(nn.Module):
    """This rank's stages of a pipelined plan (see the module docstring). Build it with
    `autopar.compile`. Like `ParallelModule`: `plan`, `coordinate`, `counter`, `slots`,
    `full_state_dict()` and `full_grads()` (collective), parameters under the model's
    names (this rank's stages' pieces only)."""

    def __init__(self, plan: Plan, *, stages: list[tuple[int, RankProgram, tuple[str, ...]]],
                 examples: dict[int, tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]],
                 slots: tuple[StateSlot, ...], pieces: dict[str, torch.Tensor],
                 persistent: set[str], device: DeviceMesh, inner: DeviceMesh | None,
                 context: RankContext | None, here: torch.device, inputs: tuple,
                 call_spec: tuple, split: BatchSplit,
                 weights: Callable[[list[list]], list[float]],
                 shared: tuple[tuple[str, int, torch.dtype], ...], loss_index: int = 0,
                 returns: tuple[TensorSpec | None, ...] | None = None) -> None:
        """`stages`: this rank's (stage index, lowered program, the flat user-input keys
        it reads); `examples` per stage empty tensors shaped as what it receives and sends
        (`boundary_examples`); `slots`/`pieces` the state of all of them (by canonical name);
        `inputs` the whole batch's flat input specs; `shared` the weights summed over the
        pipeline axis (canonical name, local elements, dtype), in the same order on every
        rank; `loss_index` is the loss's position among the model's flat outputs (the
        others, which `split_microbatches` checked are None, are returned as None);
        `returns`, for a forward-only plan, the model's flat outputs (None where a leaf is not
        a tensor), which the last stage broadcasts to the other pipeline ranks."""
        super().__init__()
        self._loss_index, self._returns = loss_index, returns
        record = plan.pipeline
        assert record is not None
        self.plan, self.microbatches = plan, record.microbatches
        self.splits_backward = schedule_named(record.schedule).splits_backward
        self.coordinate = tuple(device.get_coordinate())
        self.axis_name = record.axis
        self.context, self._inner = context, inner
        _gather_once_per_backward(context, self.splits_backward)
        self._group = device.get_group(record.axis)
        self._ranks = record.ranks
        self._counter = context.counter if context is not None else CommCounter()
        self._split, self._weights, self._inputs = split, weights, inputs
        self._in_spec, self._out_spec = call_spec
        self._shared = shared
        self._slots, self._persistent = slots, persistent
        self._constants = register_pieces(self, slots, pieces, persistent)
        # Where each slot's tensor lives, resolved once: every stage forward reads them.
        self._homes = {slot.names[0]: owner_of(self, slot.names[0]) for slot in slots
                       if slot.role != "constant"}
        by_name = {slot.names[0]: slot for slot in slots}
        self.regathers = any(r.regather and any(s.kind == "all_gather" for s in r.forward_steps)
                             for _, program, _ in stages for _, r in program.collectives)
        count = len(record.stages)
        self._stages = []
        for index, program, keys in stages:
            arguments = tuple(by_name[slot.names[0]] for slot in program.state)
            self._stages.append(StageModule(self, index, program, arguments, keys,
                                             index == 0, index == count - 1,
                                             returns_all=returns is not None))
        self._keys = sorted({key for _, _, keys in stages for key in keys})
        self._schedule = self._torch_schedule(examples, here, split)
        self._last = any(module.index == count - 1 for module in self._stages)

    def _torch_schedule(self, examples: dict, here: torch.device, split: BatchSplit):
        """torch's schedule over this rank's stages, which cuts the inputs as `split` does;
        with a loss (of the micro-batch times its weight, the schedule's target) only for
        a training plan: a forward-only plan's schedule runs no backward."""
        record = self.plan.pipeline
        count = len(record.stages)
        # Static metadata: torch would otherwise run each stage once more to infer it, with
        # its collectives.
        self._torch_stages = [TorchStage(
            module, module.index, count, here, group=self._group,
            input_args=examples[module.index][0],
            output_args=examples[module.index][1]) for module in self._stages]
        chunking = {f"in{i}": TensorChunkSpec(0) if cut else _Replicate()
                    for i, cut in enumerate(split.split)}
        options = dict(kwargs_chunk_spec={key: chunking[key] for key in self._keys})
        if self.plan.training:
            options.update(loss_fn=lambda loss, weight: loss * weight[0], scale_grads=False)
        schedule = get_schedule_class(record.schedule)
        return schedule(self._torch_stages[0] if record.virtual == 1 else self._torch_stages,
                        self.microbatches, **options)

    @property
    def slots(self) -> tuple[StateSlot, ...]:
        return self._slots

    @property
    def counter(self) -> CommCounter:
        return self._counter

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The DeviceMesh the slots' placements are on: the stages' sub-mesh (None when
        the pipeline axis is the only one)."""
        return self._inner

    def adopt(self, tensors: dict[str, torch.Tensor]) -> None:
        """`ParallelModule.adopt`: this rank's pieces held in the given tensors."""
        adopt_pieces(self, self._slots, self.value, tensors)

    def value(self, slot: StateSlot) -> torch.Tensor:
        if slot.role == "constant":
            return self._constants[slot.names[0]]
        owner, leaf = self._homes[slot.names[0]]
        return getattr(owner, leaf)

    def count_grad_sent(self, grad: torch.Tensor) -> None:
        self._counter.record("send", self.axis_name, "backward", tensor_bytes(grad))

    def _flat_inputs(self, args: tuple, kwargs: dict) -> list:
        flat = flatten_inputs(args, kwargs, self._in_spec)
        check_inputs(flat, self._inputs)
        return flat

    @property
    def inputs(self) -> tuple:
        """The flat user inputs the plan is for (`ParallelModule.inputs`)."""
        return self._inputs

    def forward(self, *args, **kwargs):
        if self._returns is not None:
            return pytree.tree_unflatten(self._serve(args, kwargs), self._out_spec)
        loss = self._step(args, kwargs)
        if self._out_spec.is_leaf():
            return loss
        leaves = [None] * self._out_spec.num_leaves
        leaves[self._loss_index] = loss
        return pytree.tree_unflatten(leaves, self._out_spec)

    def _step(self, args: tuple, kwargs: dict) -> torch.Tensor:
        flat = self._flat_inputs(args, kwargs)
        weights = self._weights(micro_inputs(flat, self._split))
        users = {key: flat[int(key[2:])] for key in self._keys}
        parameters = [p for p in self.parameters() if p.requires_grad]
        train = torch.is_grad_enabled() and bool(parameters)

        def step() -> torch.Tensor:
            losses: list[torch.Tensor] = []
            target = torch.tensor(weights, dtype=torch.float64) if self._last else None
            for module in self._stages:
                module.backwards = 0
            run = self._schedule.step if train else self._schedule.eval
            try:
                # The last stage's outputs are the losses, kept in `losses`, not merged.
                run(target=target, losses=losses if self._last else None,
                    return_outputs=False, **users)
            finally:
                if self.context is not None:
                    self.context.reducer.end_step()
            if train:
                self._sum_shared()
            return self._broadcast_loss(losses)

        if not train:
            with torch.no_grad():
                return step()
        return hand_over(step, parameters)

    def _serve(self, args: tuple, kwargs: dict) -> list:
        """A forward-only plan's flat outputs, whole on every rank: the schedule runs the
        batch through the stages, and the last stage's outputs are broadcast over the
        pipeline axis."""
        flat = self._flat_inputs(args, kwargs)
        users = {key: flat[int(key[2:])] for key in self._keys}
        with torch.no_grad():
            made = self._schedule.step(return_outputs=self._last, **users)
            made = list(made) if isinstance(made, (tuple, list)) else [made]
            leaves = []
            for spec in self._returns:
                if spec is None:
                    leaves.append(None)
                    continue
                value = made.pop(0).contiguous() if self._last else torch.empty(
                    spec.shape, dtype=spec.dtype, device=self._device())
                self._counter.record("broadcast", self.axis_name, "forward", tensor_bytes(value))
                dist.broadcast(value, group=self._group, group_src=self._ranks - 1)
                leaves.append(value)
        return leaves

    def _sum_shared(self) -> None:
        """Sum over the pipeline axis the gradients of the weights several stages hold."""
        for name, numel, dtype in self._shared:
            held = self._held(name)
            grad = held.grad if held is not None else None
            flat = grad.reshape(-1).clone() if grad is not None else torch.zeros(
                numel, dtype=dtype, device=self._device())
            self._counter.record("all_reduce", self.axis_name, "backward", tensor_bytes(flat))
            dist.all_reduce(flat, group=self._group)
            if held is not None:
                held.grad = flat.view_as(held)

    def _held(self, name: str) -> torch.Tensor | None:
        slot = next((s for s in self._slots if s.names[0] == name), None)
        return self.value(slot) if slot is not None else None

    def _device(self) -> torch.device:
        return next((p.device for p in self.parameters()), torch.device("cpu"))

    def _broadcast_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """The weighted sum of the micro-batches' losses, from the last stage to every
        pipeline rank."""
        total = torch.zeros((), dtype=torch.float32, device=self._device())
        if self._last:
            total = sum(loss.detach().float() for loss in losses).reshape(()).clone()
        self._counter.record("broadcast", self.axis_name, "forward", tensor_bytes(total))
        dist.broadcast(total, group=self._group, group_src=self._ranks - 1)
        return total

    def _gathered(self, slots: list[StateSlot], of_grad: bool) -> dict[str, torch.Tensor | None]:
        """Full tensors of this rank's `slots` (collective over the stage's sub-mesh),
        then every pipeline rank's, merged (collective over the pipeline axis)."""
        mine: dict[str, torch.Tensor | None] = {}
        for slot in slots:
            value = self.value(slot)
            piece = value.grad if of_grad else value
            full = None if piece is None else gather_full(
                piece, slot.placements, slot.shape, self._inner, self.plan.pipeline.sub_mesh.shares)
            mine.update({name: full for name in slot.names})
        every: list = [None] * self._ranks
        dist.all_gather_object(every, mine, group=self._group)
        merged: dict[str, torch.Tensor | None] = {}
        for part in every:
            for name, value in part.items():
                if merged.get(name) is None:
                    merged[name] = value
        return merged

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full parameters and persistent buffers of the whole model, from every stage
        (collective)."""
        merged = self._gathered([s for s in self._slots if s.role != "constant"], False)
        return {name: value for name, value in merged.items() if name in self._persistent}

    def full_grads(self) -> dict[str, torch.Tensor | None]:
        """Full gradient of every parameter of the whole model (collective)."""
        return self._gathered([s for s in self._slots if s.role == "parameter"], True)


def boundary_examples(stage_graph: fx.GraphModule, stage_plan: Plan,
                      coordinate: tuple[int, ...], device: torch.device, *,
                      training: bool = True
                      ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Empty tensors shaped as the pieces of a stage's received inputs and of its outputs
    (the loss, or a forward-only model's outputs, for the last stage) that the rank at
    `coordinate` of the sub-mesh holds, as `stage_plan` places them, floating ones
    requiring a gradient in a `training` step: torch's static stage metadata (each rank
    sends its piece to its counterpart in the next stage)."""
    def example(node: fx.Node, placements: str) -> torch.Tensor:
        spec = node.meta[TENSOR]
        whole = torch.empty(spec.shape, dtype=spec.dtype, device="meta")
        piece = chunk_of(whole, parse_placements(placements), stage_plan.mesh.shape, coordinate)
        return torch.empty(piece.shape, dtype=spec.dtype, device=device,
                           requires_grad=training and spec.dtype.is_floating_point)

    received = tuple(example(n, stage_plan.node(n.name).output)
                     for n in stage_graph.graph.nodes
                     if n.op == "placeholder" and n.meta.get(BOUNDARY))
    output = next(n for n in stage_graph.graph.nodes if n.op == "output")
    placed = stage_plan.node(output.name).inputs
    sent = tuple(example(v, p) for v, p in zip(
        (v for v in output.args[0] if isinstance(v, fx.Node)), placed))
    return received, sent


def stage_user_keys(stage_graph: fx.GraphModule, model_inputs: list[str]) -> tuple[str, ...]:
    """The flat user-input keys (`in<i>`) a stage's graph reads, in its placeholder order."""
    position = {name: i for i, name in enumerate(model_inputs)}
    return tuple(f"in{position[n.name]}" for n in stage_graph.graph.nodes
                 if n.op == "placeholder" and n.meta.get(ROLE) == "input"
                 and not n.meta.get(BOUNDARY))
