"""Gradient all-reduces of replicated parameters, overlapped with the rest of the backward.

A parameter replicated on an axis over which its consumer splits the computation gets a
Partial gradient there, all-reduced in the backward (DESIGN.md's last table row). Done where
the backward produces it, each all-reduce blocks the backward until it completes; that is
data parallelism's whole communication. Instead, `ReducedParameter` starts the all-reduce
asynchronously on a copy of the gradient and returns no gradient to autograd; when the
backward pass ends (an autograd engine callback), `GradientReducer.finish` waits for each
all-reduce and adds the result to the parameter's `.grad`, so the collectives run while the
backward computes the earlier layers' gradients (the overlap DDP's buckets give).

Contract: gradients of such parameters reach `.grad` only through `loss.backward()` (not
`torch.autograd.grad`), added to what `.grad` holds (accumulation stays exact), and the
bytes counted are those the plan charges (one all-reduce of the gradient on the axis).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd import Variable
from torch.distributed.device_mesh import DeviceMesh

from autopar.runtime.axis_ops import axis_name
from autopar.runtime.counter import CommCounter
from autopar.runtime.redistribution import Redistribution


def reducible(redistribution: Redistribution) -> bool:
    """Edges whose only collective is one backward all-reduce (a replicated tensor used by a
    split computation): the ones `ReducedParameter` carries out for parameters."""
    steps = redistribution.backward_steps
    return (not redistribution.forward_steps and not redistribution.regather
            and len(steps) == 1 and steps[0].kind == "all_reduce")


class GradientReducer:
    """The all-reduces in flight in one backward pass; a plain object the caller owns."""

    def __init__(self) -> None:
        self._pending: list[tuple[torch.Tensor, torch.Tensor, object]] = []

    def start(self, parameter: torch.Tensor, grad: torch.Tensor, axis: int,
              mesh: DeviceMesh, counter: CommCounter) -> None:
        buffer = grad.clone(memory_format=torch.contiguous_format)
        work = dist.all_reduce(buffer, group=mesh.get_group(axis), async_op=True)
        counter.record("all_reduce", axis_name(mesh, axis), "backward",
                       buffer.numel() * buffer.element_size())
        if not self._pending:
            Variable._execution_engine.queue_callback(self.finish)
        self._pending.append((parameter, buffer, work))

    def finish(self) -> None:
        """Wait for every all-reduce and add the sums to the parameters' gradients."""
        pending, self._pending = self._pending, []
        for parameter, buffer, work in pending:
            work.wait()
            if parameter.grad is None:
                parameter.grad = buffer
            else:
                parameter.grad.add_(buffer)


class _ReduceLater(torch.autograd.Function):
    @staticmethod
    def forward(ctx, parameter: torch.Tensor, axis: int, mesh: DeviceMesh,
                counter: CommCounter, reducer: GradientReducer) -> torch.Tensor:
        # A leaf parameter held on ctx: no reference cycle through a grad_fn.
        ctx.parameter, ctx.axis, ctx.mesh = parameter, axis, mesh
        ctx.counter, ctx.reducer = counter, reducer
        return parameter.view_as(parameter)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.reducer.start(ctx.parameter, grad, ctx.axis, ctx.mesh, ctx.counter)
        return None, None, None, None, None


def reduce_later(parameter: torch.Tensor, redistribution: Redistribution, mesh: DeviceMesh,
                 counter: CommCounter, reducer: GradientReducer) -> torch.Tensor:
    """`parameter` itself, whose gradient through this use `reducer` all-reduces (see the
    module docstring). `redistribution` must be `reducible`."""
    assert reducible(redistribution) and parameter.is_leaf, redistribution
    if not (parameter.requires_grad and torch.is_grad_enabled()):
        return parameter
    (step,) = redistribution.backward_steps
    return _ReduceLater.apply(parameter, step.axis, mesh, counter, reducer)
