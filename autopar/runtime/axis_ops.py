"""Execution of `Step`s on a rank's local tensor, over one axis of a torch DeviceMesh.

Collectives are torch.distributed's collectives over the axis's process group
(`DeviceMesh.get_group(axis)`, whose group rank is the rank's coordinate on the axis), each
writing into a new tensor so that the input is left as it was; the local steps are chunking
and zero-filling. Every collective is recorded in the caller's `CommCounter` with the cost
model's byte convention. Nothing here is differentiable: the autograd-aware wrapper lives in
`collectives.py`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autopar.runtime.counter import CommCounter, tensor_bytes
from autopar.runtime.steps import Step
from autopar.values.placement import Partial, Replicate, Shard


def axis_name(mesh: DeviceMesh, axis: int) -> str:
    """The counter's name of a mesh axis: its mesh_dim_name, else its index."""
    names = mesh.mesh_dim_names
    return names[axis] if names else str(axis)


# torch.distributed's blocking collectives rather than the functional ones: those wrap every
# result in an AsyncCollectiveTensor through a Python custom op, a few hundred microseconds of
# CPU per call (more than a small gloo all-reduce takes), for an asynchrony the steps never
# use since each waits for its result at once.
# torch 2.13 renamed the gather and scatter into one tensor (the old names warn); torch >= 2.6
# is supported, so take whichever exists.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or \
    dist.reduce_scatter_tensor


def _all_reduce(t: torch.Tensor, group) -> torch.Tensor:
    out = t.clone(memory_format=torch.contiguous_format)  # in place on a copy: t may be shared
    dist.all_reduce(out, group=group)
    return out


def _all_gather(t: torch.Tensor, dim: int, n: int, group) -> torch.Tensor:
    out, _ = start_all_gather(t, dim, n, group, async_op=False)
    return out


def start_all_gather(t: torch.Tensor, dim: int, n: int, group, *, async_op: bool = True
                     ) -> tuple[torch.Tensor, object]:
    """Concatenate `t` over `group` (`n` ranks) along `dim`, the all_gather step, without
    waiting (unless not `async_op`): (the result, valid once the work is waited on, possibly
    a non-contiguous view; the torch.distributed work, None when not `async_op`)."""
    # Gather along dim 0, where the pieces are contiguous blocks in group-rank order.
    front = t.movedim(dim, 0).contiguous()
    out = front.new_empty((n * front.shape[0], *front.shape[1:]))
    work = all_gather_single(out, front, group=group, async_op=async_op)
    return out.movedim(0, dim), work


def _reduce_scatter(t: torch.Tensor, dim: int, n: int, group) -> torch.Tensor:
    out, _, _ = start_reduce_scatter(t, dim, n, group, async_op=False)
    return out


def start_reduce_scatter(t: torch.Tensor, dim: int, n: int, group, *, async_op: bool = True
                         ) -> tuple[torch.Tensor, object, torch.Tensor]:
    """Sum `t` over `group` (`n` ranks) and keep this rank's chunk along `dim`, the
    reduce_scatter step, without waiting (unless not `async_op`): (the chunk, valid once
    the work is waited on, possibly a non-contiguous view; the torch.distributed work, None
    when not `async_op`; the buffer sent, which must stay alive until then)."""
    # Scatter along dim 0, where the pieces are contiguous blocks in group-rank order.
    front = t.movedim(dim, 0).contiguous()
    out = front.new_empty((front.shape[0] // n, *front.shape[1:]))
    work = reduce_scatter_single(out, front, group=group, async_op=async_op)
    return out.movedim(0, dim), work, front


def _all_to_all(t: torch.Tensor, src_dim: int, dst_dim: int, n: int, group) -> torch.Tensor:
    # Piece j (chunk j along dst_dim) goes to coordinate j; what comes back from j is its
    # src_dim shard j restricted to our dst_dim chunk, so concatenating along src_dim in
    # coordinate order rebuilds that dim.
    # Contiguous, whatever the memory format of t (stack and empty_like keep channels-last,
    # which a collective refuses).
    send = torch.stack(t.chunk(n, dst_dim)).contiguous()
    recv = torch.empty_like(send, memory_format=torch.contiguous_format)
    dist.all_to_all_single(recv, send, group=group)
    del send  # not held while the result is laid out (`autopar.costs.staging`)
    if src_dim == 0:
        return recv.flatten(0, 1)  # the pieces are already in place
    return torch.cat(recv.unbind(0), dim=src_dim)


def _scatter_into_zeros(t: torch.Tensor, dim: int, n: int, coordinate: int) -> torch.Tensor:
    # A Partial value whose summands are the shards, each at its place in zeros.
    shape = list(t.shape)
    shape[dim] *= n
    out = t.new_zeros(shape)
    out.narrow(dim, coordinate * t.shape[dim], t.shape[dim]).copy_(t)
    return out


def apply_step(t: torch.Tensor, step: Step, mesh: DeviceMesh, counter: CommCounter,
               direction: str) -> torch.Tensor:
    """Convert local tensor `t` by one step; record its collective (if any) in `counter`."""
    src, dst = step.src, step.dst
    n, coordinate = mesh.size(step.axis), mesh.get_local_rank(step.axis)
    kind = step.kind
    if kind is None:
        if isinstance(dst, Partial) and isinstance(src, Replicate):
            return t if coordinate == 0 else torch.zeros_like(t)
        if isinstance(dst, Partial):
            return _scatter_into_zeros(t, src.dim, n, coordinate)
        return t.chunk(n, dst.dim)[coordinate].contiguous()  # R -> S(d)
    group = mesh.get_group(step.axis)
    if kind == "all_reduce":
        out, nbytes = _all_reduce(t, group), tensor_bytes(t)
    elif kind == "reduce_scatter":
        out, nbytes = _reduce_scatter(t, dst.dim, n, group), tensor_bytes(t)
    elif kind == "all_gather":
        out = _all_gather(t, src.dim, n, group)
        nbytes = tensor_bytes(out)
    else:
        assert kind == "all_to_all" and isinstance(src, Shard) and isinstance(dst, Shard)
        out, nbytes = _all_to_all(t, src.dim, dst.dim, n, group), tensor_bytes(t)
    counter.record(kind, axis_name(mesh, step.axis), direction, nbytes)
    return out


def owned(t: torch.Tensor) -> torch.Tensor:
    """`t` contiguous, copied when it is a view into a larger buffer: what holds it then
    holds its own bytes only, not the rest of that buffer."""
    t = t.contiguous()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


def apply_steps(t: torch.Tensor, steps: tuple[Step, ...], mesh: DeviceMesh,
                counter: CommCounter, direction: str) -> torch.Tensor:
    """Apply `steps` in order; the result is contiguous and, when any step ran, a tensor of
    its own that holds exactly its bytes: a local slice is copied out of what it slices,
    and so is a collective's output out of a larger buffer (a slice after a reduce-scatter
    or an all-to-all, whose cuts run first).

    Why: a consumer that saves what an edge hands it, or a `.grad` built from a gradient,
    then holds only that, and the tensor it was converted from is freed once nothing else
    holds it: what the cost model charges (`passes/problem/edge_costs.held_bytes`, a
    converted tensor at its own placement; a gradient at its parameter's), the same on
    every rank (`R -> P` hands rank 0 the tensor itself, the others zeros)."""
    source = t
    for step in steps:
        t = apply_step(t, step, mesh, counter, direction)
    t = t.contiguous()
    if steps and t.numel() and source.numel() \
            and t.untyped_storage().data_ptr() == source.untyped_storage().data_ptr():
        return t.clone()
    return owned(t) if steps or direction == "backward" else t
