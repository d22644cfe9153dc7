"""Gradient all-reduces of replicated parameters, overlapped with the rest of the backward.

A parameter replicated on an axis over which its consumer splits the computation gets a
Partial gradient there, all-reduced in the backward (DESIGN.md's last table row). Done where
the backward produces it, each all-reduce blocks the backward until it completes; that is
data parallelism's whole communication. Instead, `reduce_later` hands the gradient to a
`GradientReducer` and returns no gradient to autograd: the reducer packs gradients into
buckets, all-reduces each full bucket asynchronously, and when the backward pass ends (an
autograd engine callback) reduces the rest, waits, and adds the sums to the parameters'
`.grad`, so the collectives run while the backward computes the earlier layers' gradients
(the overlap DDP's buckets give).

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

# Gradients packed into one all-reduce, at most (about DDP's first bucket).
BUCKET_BYTES = 1 << 20


def reducible(redistribution: Redistribution) -> bool:
    """Edges whose only collective is one backward all-reduce (a replicated tensor used by a
    split computation): the ones `reduce_later` carries out for parameters."""
    # (A regathered edge without forward steps gathers nothing: the flag changes nothing.)
    steps = redistribution.backward_steps
    return (not redistribution.forward_steps and len(steps) == 1
            and steps[0].kind == "all_reduce")


class GradientReducer:
    """The gradients waiting for their all-reduce in one backward pass; a plain object the
    caller owns. Each one starts its all-reduce at once (so it overlaps the backward) while
    the bucket of gradients on its axis is small; gradients arriving in a row are otherwise
    packed into one buffer, all-reduced in one call when the bucket is full or the backward
    ends: per-call cost, not bandwidth, dominates small all-reduces."""

    def __init__(self, bucket_bytes: int = BUCKET_BYTES) -> None:
        self.bucket_bytes = bucket_bytes
        self._buckets: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._meshes: dict[tuple[int, int], DeviceMesh] = {}
        self._in_flight: list[tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor,
                                    object]] = []

    def start(self, parameter: torch.Tensor, grad: torch.Tensor, axis: int,
              mesh: DeviceMesh, counter: CommCounter) -> None:
        if not self._buckets and not self._in_flight:
            Variable._execution_engine.queue_callback(self.finish)
        counter.record("all_reduce", axis_name(mesh, axis), "backward",
                       grad.numel() * grad.element_size())
        key = (id(mesh), axis)
        self._meshes[key] = mesh
        bucket = self._buckets.setdefault(key, [])
        bucket.append((parameter, grad))
        if sum(g.numel() * g.element_size() for _, g in bucket) >= self.bucket_bytes:
            self._launch(key)

    def _launch(self, key: tuple[int, int]) -> None:
        bucket = self._buckets.pop(key)
        mesh, axis = self._meshes[key], key[1]
        # A new buffer: the incoming gradients may be shared with other branches.
        flat = torch.cat([g.reshape(-1) for _, g in bucket])
        work = dist.all_reduce(flat, group=mesh.get_group(axis), async_op=True)
        self._in_flight.append((bucket, flat, work))

    def finish(self) -> None:
        """Reduce what is left, wait for every all-reduce, add the sums to the gradients."""
        for key in list(self._buckets):
            self._launch(key)
        in_flight, self._in_flight = self._in_flight, []
        for bucket, flat, work in in_flight:
            work.wait()
            offset = 0
            for parameter, grad in bucket:
                summed = flat[offset:offset + grad.numel()].view_as(grad)
                offset += grad.numel()
                if parameter.grad is None:
                    # A view into this step's bucket (a new buffer each step, so no later
                    # step writes into it): copying it out measured 2-3 ms per step on a
                    # 4 MB bucket, more than the whole gap to DDP.
                    parameter.grad = summed
                else:
                    parameter.grad.add_(summed)


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


def reduce_later(parameter: torch.Tensor, axis: int, mesh: DeviceMesh, counter: CommCounter,
                 reducer: GradientReducer) -> torch.Tensor:
    """`parameter` itself, whose gradient through this use `reducer` all-reduces over mesh
    axis `axis` (see the module docstring): the use's edge is `reducible`, its one backward
    step on `axis`, as the caller checked once when it built the program."""
    if not (parameter.requires_grad and torch.is_grad_enabled()):
        return parameter
    return _ReduceLater.apply(parameter, axis, mesh, counter, reducer)
