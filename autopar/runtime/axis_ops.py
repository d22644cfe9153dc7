"""Execution of `Step`s on a rank's local tensor, over one axis of a torch DeviceMesh.

Collectives are torch.distributed's collectives over the axis's process group
(`DeviceMesh.get_group(axis)`, whose group rank is the rank's coordinate on the axis), each
writing into a new tensor so that the input is left as it was; the local steps are chunking
and zero-filling. Pieces follow DTensor's chunking; uneven ones travel padded to the largest
piece, the padding counted as moved. Every collective is recorded in the caller's
`CommCounter` with the cost model's byte convention. Nothing here is differentiable: the
autograd-aware wrapper lives in `collectives.py`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autopar.runtime.counter import CommCounter, tensor_bytes
from autopar.runtime.quantize import DequantizingWork, quantize
from autopar.runtime.steps import Step
from autopar.values.placement import Partial, Replicate, Shard, chunk_extent


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


def _padded(t: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    """`t` with zeros after its end along `dim` up to `length` (itself when as long)."""
    extra = length - t.shape[dim]
    if not extra:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t, t.new_zeros(shape)], dim)


def _full_first(lengths: tuple[int, ...]) -> bool:
    """Whether every piece before the last non-empty one is of the largest length
    (DTensor's chunking): padding them all to it then only pads the end."""
    largest = max(lengths)
    last = max((i for i, length in enumerate(lengths) if length), default=0)
    return all(length == largest for length in lengths[:last])


def _spread(t: torch.Tensor, dim: int, lengths: tuple[int, ...]) -> torch.Tensor:
    """`t`, whose `dim` holds pieces of `lengths` end to end, with piece i moved to
    i x the largest length, zeros between."""
    largest = max(lengths)
    if _full_first(lengths):
        return _padded(t, dim, largest * len(lengths))
    return torch.cat([_padded(piece, dim, largest)
                      for piece in t.split(list(lengths), dim)], dim)


def _collect(t: torch.Tensor, dim: int, lengths: tuple[int, ...]) -> torch.Tensor:
    """The inverse of `_spread`: the pieces of `lengths` at i x the largest, end to end."""
    largest = max(lengths)
    if _full_first(lengths):
        return t.narrow(dim, 0, sum(lengths))
    return torch.cat([t.narrow(dim, i * largest, length) for i, length in enumerate(lengths)],
                     dim)


def start_all_gather(t: torch.Tensor, step: Step, mesh: DeviceMesh, *, async_op: bool = True
                     ) -> tuple[torch.Tensor, object, int]:
    """Concatenate `t` along the dim `step` gathers over its axis, without waiting (unless
    not `async_op`): (the result, valid once the work is waited on, possibly a view; the
    torch.distributed work, None when not `async_op`; the bytes gathered). Uneven pieces
    travel padded to the largest."""
    dim, n = step.src.dim, mesh.size(step.axis)
    lengths = step.lengths(_whole(step, dim, mesh), n)
    largest = max(lengths)
    # Gather along dim 0, where the pieces are contiguous blocks in group-rank order.
    front = _padded(t.movedim(dim, 0), 0, largest).contiguous()
    out = front.new_empty((n * largest, *front.shape[1:]))
    if step.quantized:
        work, nbytes = _start_quantized_gather(front, out, n, mesh.get_group(step.axis),
                                               async_op=async_op)
    else:
        work = all_gather_single(out, front, group=mesh.get_group(step.axis),
                                 async_op=async_op)
        nbytes = tensor_bytes(out)
    if _full_first(lengths):  # the pieces lie end to end at the front: a view
        return out.narrow(0, 0, sum(lengths)).movedim(0, dim), work, nbytes
    collected = out.new_empty((sum(lengths), *out.shape[1:]))
    work = CollectingWork(work, out, collected, lengths)
    if not async_op:
        work.wait()
        work = None
    return collected.movedim(0, dim), work, nbytes


class CollectingWork:
    """A gather in flight whose pieces (shares: longer ones after shorter) lie apart in its
    padded buffer `gathered`: `wait` waits for it and writes them end to end into
    `collected`, which is the gather's result."""

    def __init__(self, work, gathered: torch.Tensor, collected: torch.Tensor,
                 lengths: tuple[int, ...]) -> None:
        self._work, self._gathered, self._collected = work, gathered, collected
        self._lengths = lengths

    def wait(self) -> None:
        if self._work is not None:
            self._work.wait()
        self._collected.copy_(_collect(self._gathered, 0, self._lengths))


def _start_quantized_gather(front: torch.Tensor, out: torch.Tensor, n: int, group, *,
                            async_op: bool) -> tuple[object, int]:
    """Gather `front` from the `n` ranks of `group` into `out` as int8 blocks and their
    scales (`quantize`): the work that dequantizes into `out` when waited on (None, done,
    when not `async_op`) and the bytes moved."""
    values, scales = quantize(front.view(-1))
    gathered = (values.new_empty(n * values.numel()), scales.new_empty(n * scales.numel()))
    works = tuple(all_gather_single(whole, piece, group=group, async_op=True)
                  for whole, piece in zip(gathered, (values, scales)))
    work = DequantizingWork(works, *gathered, out.view(n, front.numel()))
    if not async_op:
        work.wait()
    return (work if async_op else None), sum(map(tensor_bytes, gathered))


def start_reduce_scatter(t: torch.Tensor, step: Step, mesh: DeviceMesh, *,
                         async_op: bool = True) -> tuple[torch.Tensor, object, torch.Tensor]:
    """Sum `t` over the axis of `step` and keep this rank's piece along the dim it
    scatters, without waiting (unless not `async_op`): (the piece, valid once the work is
    waited on, possibly a view; the torch.distributed work, None when not `async_op`; the
    buffer sent, which must stay alive until then, and whose bytes are the step's)."""
    dim, n = step.dst.dim, mesh.size(step.axis)
    lengths = step.lengths(t.shape[dim], n)
    # Scatter along dim 0, where the pieces are contiguous blocks in group-rank order.
    front = _spread(t.movedim(dim, 0), 0, lengths).contiguous()
    out = front.new_empty((max(lengths), *front.shape[1:]))
    work = reduce_scatter_single(out, front, group=mesh.get_group(step.axis), async_op=async_op)
    length = lengths[mesh.get_local_rank(step.axis)]
    return out[:length].movedim(0, dim), work, front


def _all_to_all(t: torch.Tensor, step: Step, mesh: DeviceMesh) -> tuple[torch.Tensor, int]:
    # Piece j (chunk j along dst_dim) goes to coordinate j; what comes back from j is its
    # src_dim shard j restricted to our dst_dim chunk, so concatenating along src_dim in
    # coordinate order rebuilds that dim. Uneven pieces travel padded to the largest.
    src_dim, dst_dim, n = step.src.dim, step.dst.dim, mesh.size(step.axis)
    gathered = step.lengths(_whole(step, src_dim, mesh), n)
    cut = step.lengths(t.shape[dst_dim], n)
    t = _spread(_padded(t, src_dim, max(gathered)), dst_dim, cut)
    # Contiguous, whatever the memory format of t (stack and empty_like keep channels-last,
    # which a collective refuses).
    send = torch.stack(t.chunk(n, dst_dim)).contiguous()
    recv = torch.empty_like(send, memory_format=torch.contiguous_format)
    dist.all_to_all_single(recv, send, group=mesh.get_group(step.axis))
    nbytes = tensor_bytes(send)
    del send  # not held while the result is laid out (`autopar.costs.staging`)
    out = recv.flatten(0, 1) if src_dim == 0 else torch.cat(recv.unbind(0), dim=src_dim)
    length = cut[mesh.get_local_rank(step.axis)]
    return _collect(out, src_dim, gathered).narrow(dst_dim, 0, length), nbytes


def _scatter_into_zeros(t: torch.Tensor, step: Step, mesh: DeviceMesh) -> torch.Tensor:
    # A Partial value whose summands are the shards, each at its place in zeros.
    dim, n = step.src.dim, mesh.size(step.axis)
    shape = list(t.shape)
    shape[dim] = _whole(step, dim, mesh)
    lengths = step.lengths(shape[dim], n)
    index = mesh.get_local_rank(step.axis)
    out = t.new_zeros(shape)
    out.narrow(dim, sum(lengths[:index]), lengths[index]).copy_(t)
    return out


def _whole(step: Step, dim: int, mesh: DeviceMesh) -> int:
    """`Step.whole` at this rank's coordinate."""
    return step.whole(dim, tuple(mesh.shape), tuple(mesh.get_coordinate()))


def piece_of(t: torch.Tensor, dim: int, n: int, index: int,
             weights: tuple[int, ...] | None = None) -> torch.Tensor:
    """Piece `index` of `t` cut in `n` along `dim` (DTensor's chunking, or in proportion to
    `weights`; a view)."""
    return t.narrow(dim, *chunk_extent(t.shape[dim], n, index, weights))


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
            return _scatter_into_zeros(t, step, mesh)
        weights = None if step.shares is None else step.shares[step.axis]
        return piece_of(t, dst.dim, n, coordinate, weights).contiguous()  # R -> S(d)
    dtype = t.dtype
    if kind in ("all_reduce", "reduce_scatter") and step.reduce_dtype is not None:
        t = t.to(step.reduce_dtype)  # compressed: reduced in reduce_dtype, then cast back
    if kind == "all_reduce":
        out, nbytes = _all_reduce(t, mesh.get_group(step.axis)), tensor_bytes(t)
    elif kind == "reduce_scatter":
        out, _, sent = start_reduce_scatter(t, step, mesh, async_op=False)
        nbytes = tensor_bytes(sent)
    elif kind == "all_gather":
        out, _, nbytes = start_all_gather(t, step, mesh, async_op=False)
    else:
        assert kind == "all_to_all" and isinstance(src, Shard) and isinstance(dst, Shard)
        out, nbytes = _all_to_all(t, step, mesh)
    counter.record(kind, axis_name(mesh, step.axis), direction, nbytes)
    return out.to(dtype)


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
