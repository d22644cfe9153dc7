"""One stage of a pipelined rank as torch's schedules run it: the stage's rank program as
the module a `PipelineStage` calls (`StageModule`), torch's stage with the weight pass of a
split backward run as a backward pass (`TorchStage`), and the boundary marks that count
what a stage sends and start its backward. `autopar.runtime.pipeline.PipelinedModule`
holds the parameters and the step's state (`StageOwner`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.distributed.pipelining import PipelineStage

from autopar.runtime.collectives import RankContext
from autopar.runtime.counter import CommCounter, tensor_bytes
from autopar.runtime.pending import PendingSum
from autopar.runtime.program import RankProgram, StateSlot


class StageOwner(Protocol):
    """What a stage reads of the pipelined module that owns it."""

    context: RankContext | None
    counter: CommCounter
    axis_name: str
    splits_backward: bool
    microbatches: int
    regathers: bool

    def value(self, slot: StateSlot) -> torch.Tensor: ...

    def count_grad_sent(self, grad: torch.Tensor) -> None: ...


class _Boundary(torch.autograd.Function):
    """Identity on a stage's floating outputs that marks the start of the stage's backward
    for one micro-batch (`on_backward`, before any gradient of the stage is made) and
    hands torch plain tensors to send (a pending all-reduce is waited for)."""

    @staticmethod
    def forward(ctx, on_backward: Callable[[], None], copy: bool, *outputs: torch.Tensor):
        ctx.on_backward = on_backward
        # A schedule that splits the backward detaches what a stage sent in place, which
        # a view can't be: it gets copies.
        return tuple(t.clone() if copy or isinstance(t, PendingSum) else t.view_as(t)
                     for t in outputs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        ctx.on_backward()
        return None, None, *grads


class _CountGrad(torch.autograd.Function):
    """Identity on a received tensor whose backward counts the gradient sent back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, record: Callable[[torch.Tensor], None]) -> torch.Tensor:
        ctx.record = record
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.record(grad)
        return grad, None


class StageModule(nn.Module):
    """One stage's rank program as torch's `PipelineStage` calls it:
    `forward(*received, **user_inputs)` -> the tensors to send (or the loss, or a
    forward-only model's outputs)."""

    def __init__(self, owner: StageOwner, index: int, program: RankProgram,
                 arguments: tuple[StateSlot, ...], user_keys: tuple[str, ...],
                 is_first: bool, is_last: bool, *, returns_all: bool = False) -> None:
        """`returns_all`: the last stage returns all the model's tensor outputs (a
        forward-only plan's), not its loss alone."""
        super().__init__()
        self._owner = [owner]  # not a submodule: the owner holds the parameters
        self.index, self._program, self._arguments = index, program, arguments
        self._user_keys = user_keys
        self._is_first, self._is_last = is_first, is_last
        self._returns_all = returns_all
        self.backwards = 0

    def forward(self, *received: torch.Tensor, **users) -> torch.Tensor | tuple:
        owner = self._owner[0]
        if not self._is_first:
            received = tuple(_CountGrad.apply(t, owner.count_grad_sent)
                             if t.is_floating_point() and t.requires_grad else t
                             for t in received)
        values = [owner.value(slot) for slot in self._arguments]
        context, scope = owner.context, self._program.recompute
        if context is not None:
            context.prefetch.begin()
            if scope is None and owner.regathers:
                scope = context.regather
        inputs = (*values, *received, *(users[key] for key in self._user_keys))
        if scope is None:
            outputs = self._program.module(*inputs)
        else:
            with scope:
                outputs = self._program.module(*inputs)
        if self._is_last and self._returns_all:
            return tuple(o for o in outputs if isinstance(o, torch.Tensor))
        if self._is_last:
            sent = [next(o for o in outputs if isinstance(o, torch.Tensor))]
        else:
            sent = [t.contiguous() for t in outputs]  # torch sends contiguous tensors only
            for t in sent:
                owner.counter.record("send", owner.axis_name, "forward", tensor_bytes(t))
        floating = [i for i, t in enumerate(sent) if t.requires_grad]
        if floating:
            marked = _Boundary.apply(self._backward_starts, owner.splits_backward,
                                     *(sent[i] for i in floating))
            for i, t in zip(floating, marked):
                sent[i] = t
        return sent[0] if self._is_last else tuple(sent)

    def parameters(self, recurse: bool = True):
        """The parameters this stage reads (its owner holds them), and the step's gathered
        copies of those gathered once per step (ZeRO-1, `GradientReducer.whole_copy`:
        leaves of their own, which the parameters' gradients are reduced from): the weight
        pass of a schedule that splits the backward computes their gradients."""
        owner = self._owner[0]
        values = [owner.value(slot) for slot in self._arguments]
        weights = [v for v in values if isinstance(v, nn.Parameter) and v.requires_grad]
        yield from weights
        if owner.context is not None:
            yield from owner.context.reducer.whole_copies(weights)

    def _backward_starts(self) -> None:
        # Replicated parameters' gradient all-reduces wait for this stage's last micro-batch
        # (with a split backward, its last weight pass: `TorchStage`).
        self.backwards += 1
        owner = self._owner[0]
        if owner.context is not None and not owner.splits_backward:
            owner.context.reducer.deferring = self.backwards < owner.microbatches


class TorchStage(PipelineStage):
    """torch's stage with the weight pass of a split backward run as a backward pass.

    torch computes the weight gradients with `autograd.grad` and stores them itself; the
    rank programs' parameter uses (`reduce_later`, `gather_kept`, ZeRO-1 copies) reduce
    their gradients from their own backward and hand none to autograd, so here the pass is
    `autograd.backward` from the saved intermediates into the stage's parameters, as the
    whole backward would run it. The gradient reducer sums the gradients of a weight pass
    that is not the stage's last locally, and reduces them at the last."""

    def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward: bool = False):
        context = self.submod._owner[0].context
        if context is not None:
            context.reducer.deferring = not last_backward
        return super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs: dict,
                                   last_backward: bool = False):
        if backward_type != "weight":
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs,
                                                      last_backward=last_backward)
        leaves = {get_gradient_edge(p).node: p for p in self.submod.parameters()}
        for group in bwd_kwargs["param_groups"]:
            _weight_pass(group, [leaves[node] for node in group["params"]])
        return (), None


def _weight_pass(group: dict, weights: list[torch.Tensor]) -> None:
    """One parameter group's weight gradients (a group of torch's `stage_backward_input`):
    backward from its intermediates with the gradients they received in the input pass,
    into `weights` only (the inputs' gradients were made then). Each intermediate's
    gradient is pinned to the saved one, so none is counted twice through another."""
    intermediates, saved = group.pop("intermediates"), group.pop("grads", None)
    if saved is None:
        return
    edges, grads = [], []
    for node, received in zip(intermediates, saved):
        for i, grad in enumerate(received):
            if grad is not None:
                edges.append(GradientEdge(node, i))
                grads.append(grad)
    handles = [node.register_prehook(lambda _, kept=received: kept)
               for node, received in zip(intermediates, saved)] if len(intermediates) > 1 else []
    try:
        if edges:
            torch.autograd.backward(edges, grad_tensors=grads, inputs=weights)
    finally:
        for handle in handles:
            handle.remove()
