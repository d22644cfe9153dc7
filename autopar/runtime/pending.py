"""Outputs whose final all-reduce completes in the background: `PendingSum`.

A rank program returns global outputs, so an output the plan leaves as a partial sum (the
loss of a data-parallel plan is a sum over each rank's part of the batch) is all-reduced
before it is returned. Waiting for that all-reduce at the end of the forward makes every
rank wait for the slowest one there, and once more at the end of the backward, where the
gradients are reduced: the step pays the ranks' drift twice. Nothing in the backward needs
the summed value, only its shape, so `reduce_output` starts the all-reduce and returns a
`PendingSum`: a tensor that waits for its value the first time anything reads it (`item()`,
printing, any op on it) and never before. `loss.backward()` creates the seed gradient with
`ones_like`, which reads only the shape, so the backward starts at once and the loss's
all-reduce overlaps it.

The all-reduce starts at the end of the forward, not later. On a CPU process group each
collective wakes gloo's threads, and starting the sum together with the backward's first
gradient bucket instead measured about 2% of a data-parallel step faster on two busy cores.
But a rank only reaches that bucket if it runs the backward: one that reads the loss alone
(`if rank == 0: print(loss.item())`) while another waits in some other collective first
(`dist.barrier()`) would wait for it forever. The end of the forward is the one point
every rank is sure to reach.

Contract: a `PendingSum` behaves as the summed tensor in every op (results are plain
tensors); `detach()` stays pending. Like any collective, every rank starts it in the same
order; reading it on one rank only is fine.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.utils import _pytree as pytree

from autopar.runtime.axis_ops import axis_name
from autopar.runtime.counter import CommCounter
from autopar.runtime.redistribution import Redistribution

# Ops that read only the metadata of their input: they run without waiting.
_SHAPE_ONLY = {
    torch.ops.aten.ones_like.default, torch.ops.aten.zeros_like.default,
    torch.ops.aten.empty_like.default, torch.ops.aten.full_like.default,
}
# Ops that alias their input: the result shares the pending sum.
_ALIASES = {torch.ops.aten.detach.default, torch.ops.aten.alias.default}


class PendingSum(torch.Tensor):
    """A tensor whose value (`_buffer`) an asynchronous all-reduce (`_work`) is writing."""

    _buffer: torch.Tensor
    _work: object

    @staticmethod
    def __new__(cls, buffer: torch.Tensor, work, requires_grad: bool = False):
        pending = torch.Tensor._make_wrapper_subclass(
            cls, buffer.shape, strides=buffer.stride(), dtype=buffer.dtype,
            device=buffer.device, requires_grad=requires_grad)
        pending._buffer, pending._work = buffer, work
        return pending

    def __init__(self, buffer: torch.Tensor, work, requires_grad: bool = False) -> None:
        super().__init__()

    def wait(self) -> torch.Tensor:
        """The summed value, as a plain tensor (waits for the all-reduce once)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        return self._buffer

    def __repr__(self, *, tensor_contents=None) -> str:
        return repr(self.wait())

    def __tensor_flatten__(self):
        return ["_buffer"], None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _ALIASES:
            # The alias waits on the same work (waiting on finished work returns at once).
            (pending,) = args
            return PendingSum(pending._buffer, pending._work)
        value = _buffer_of if func in _SHAPE_ONLY else PendingSum.wait
        return func(*_replaced(args, value), **_replaced(kwargs, value))


def _buffer_of(pending: PendingSum) -> torch.Tensor:
    return pending._buffer


def _replaced(arguments: tuple | dict, value):
    """`arguments` with every PendingSum p replaced by `value(p)`. The backward's seed
    (`ones_like(loss)`) and every read of a loss come here: top-level arguments are
    replaced directly, as a tree walk costs about 100 us per call."""
    items = arguments.values() if isinstance(arguments, dict) else arguments
    if any(isinstance(a, (list, tuple, dict)) for a in items):
        return pytree.tree_map_only(PendingSum, value, arguments)
    if isinstance(arguments, dict):
        return {k: value(a) if isinstance(a, PendingSum) else a for k, a in arguments.items()}
    return [value(a) if isinstance(a, PendingSum) else a for a in arguments]


def pending_reducible(redistribution: Redistribution) -> bool:
    """Edges whose only collective is one forward all-reduce (`P -> R` on one axis; the
    backward, `R -> P`, passes the gradient unchanged): the ones `reduce_output` runs."""
    steps = redistribution.forward_steps
    return (len(steps) == 1 and steps[0].kind == "all_reduce"
            and not redistribution.backward_steps)


class _ReduceOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        buffer = x.clone(memory_format=torch.contiguous_format)  # x may be saved elsewhere
        work = dist.all_reduce(buffer, group=group, async_op=True)
        return PendingSum(buffer, work)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def reduce_output(x: torch.Tensor, redistribution: Redistribution, mesh: DeviceMesh,
                  counter: CommCounter) -> torch.Tensor:
    """`x` converted along a `pending_reducible` edge: its sum over the edge's mesh axis, as
    a `PendingSum` (see the module docstring). Recorded on `counter` like any all-reduce."""
    assert pending_reducible(redistribution), redistribution
    (step,) = redistribution.forward_steps
    counter.record("all_reduce", axis_name(mesh, step.axis), "forward",
                   x.numel() * x.element_size())
    return _ReduceOutput.apply(x, mesh.get_group(step.axis))
