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

A gradient that fills a bucket alone is all-reduced in place, without the copy into a bucket
(on two busy cores, with glibc's default malloc page-faulting each new bucket in, that copy
measured about 5% of a data-parallel step), when the use's consumer op makes it a new
tensor that nothing else holds (`owns_gradient`). An op that hands its incoming gradient on
as it is (`add`, `clone`, views) may share it with another branch of the backward, which
must not see it summed: such gradients are always copied.

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

# Ops whose backward computes each tensor operand's gradient as a new tensor (a matmul,
# convolution, embedding or normalization kernel, or a product), never as the incoming
# gradient itself or a view of it.
_GRADIENT_MAKERS = frozenset(
    getattr(torch.ops.aten, name) for name in (
        "linear", "addmm", "mm", "bmm", "baddbmm", "matmul", "einsum", "convolution",
        "conv1d", "conv2d", "conv3d", "embedding", "layer_norm", "native_layer_norm",
        "group_norm", "native_group_norm", "rms_norm", "mul", "div"))


def owns_gradient(consumer_target) -> bool:
    """Whether the gradient a parameter's use receives from `consumer_target` (an fx node's
    target) is a new tensor nothing else holds, so that reducing it in place is safe."""
    return getattr(consumer_target, "overloadpacket", None) in _GRADIENT_MAKERS


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
              mesh: DeviceMesh, counter: CommCounter, *, owned: bool = False) -> None:
        """Take `parameter`'s gradient `grad` to all-reduce over mesh axis `axis`; `owned`:
        nothing else holds `grad` (see `owns_gradient`), so it may be summed in place."""
        if not self._buckets and not self._in_flight:
            Variable._execution_engine.queue_callback(self.finish)
        nbytes = grad.numel() * grad.element_size()
        counter.record("all_reduce", axis_name(mesh, axis), "backward", nbytes)
        if owned and nbytes >= self.bucket_bytes and grad.is_contiguous():
            self._all_reduce([(parameter, grad)], grad.view(-1), mesh, axis)
            return
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
        self._all_reduce(bucket, torch.cat([g.reshape(-1) for _, g in bucket]), mesh, axis)

    def _all_reduce(self, bucket: list[tuple[torch.Tensor, torch.Tensor]], flat: torch.Tensor,
                    mesh: DeviceMesh, axis: int) -> None:
        """Start summing `flat` (`bucket`'s gradients end to end) in place over `axis`."""
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
                counter: CommCounter, reducer: GradientReducer, owned: bool) -> torch.Tensor:
        # A leaf parameter held on ctx: no reference cycle through a grad_fn.
        ctx.parameter, ctx.axis, ctx.mesh = parameter, axis, mesh
        ctx.counter, ctx.reducer, ctx.owned = counter, reducer, owned
        return parameter.view_as(parameter)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.reducer.start(ctx.parameter, grad, ctx.axis, ctx.mesh, ctx.counter,
                          owned=ctx.owned)
        return None, None, None, None, None, None


def reduce_later(parameter: torch.Tensor, axis: int, mesh: DeviceMesh, counter: CommCounter,
                 reducer: GradientReducer, *, owned: bool = False) -> torch.Tensor:
    """`parameter` itself, whose gradient through this use `reducer` all-reduces over mesh
    axis `axis` (see the module docstring): the use's edge is `reducible`, its one backward
    step on `axis`, as the caller checked once when it built the program. `owned`: the
    use's consumer op `owns_gradient`."""
    if not (parameter.requires_grad and torch.is_grad_enabled()):
        return parameter
    return _ReduceLater.apply(parameter, axis, mesh, counter, reducer, owned)
