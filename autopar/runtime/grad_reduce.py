"""Gradient all-reduces of replicated parameters, overlapped with the rest of the backward.

A parameter replicated on an axis over which its consumer splits the computation gets a
Partial gradient there, all-reduced in the backward (docs/DESIGN.md's last table row). Done where
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

A parameter stored sharded and gathered for its use, kept gathered to its backward (ZeRO-2)
or gathered again there (ZeRO-3, the `Regather` scope), gets the same treatment when its
edge is one all-gather and one reduce-scatter on the same axis (`scatterable`):
`gather_kept` all-gathers it in the forward as `redistribute` would, and hands the
gradient of the gathered copy to the reducer, which starts its reduce-scatter at once (one
per gradient: packing several into one call would need them interleaved rank by rank) and
adds this rank's chunk to the shard's `.grad` once it is done. At most
`SCATTERS_IN_FLIGHT` run at once (FSDP's one reduce-scatter behind the next layer's
backward): starting one more first completes the oldest, so that the whole gradients sent
are freed as the backward goes, not all held to its end.

In a step of several micro-batches (`autopar.runtime.microbatches`) the reducer also
accumulates: while `deferring`, a replicated parameter's gradient is summed locally and
all-reduced once, in the last micro-batch's backward (DDP's `no_sync`); and a parameter
kept gathered for the whole step (ZeRO-1, `whole_copy`) is gathered once into a leaf copy
whose gradient accumulates over the micro-batches, reduce-scattered in the background of
the last one's backward as soon as it is complete.

Contract: gradients of such parameters reach `.grad` only through `loss.backward()` (not
`torch.autograd.grad`), added to what `.grad` holds (accumulation stays exact), and the
bytes counted are those the plan charges (one all-reduce of the gradient on the axis; one
reduce-scatter of the gathered copy's gradient, counted by its input as `axis_ops` does).
A `.grad` set here holds no more than the gradients: a reduce-scattered one owns its
storage, all-reduced ones share their bucket only when the bucket holds nothing else.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd import Variable
from torch.distributed.device_mesh import DeviceMesh

from autopar.costs.formulas import GRADIENT_BUCKET_BYTES
from autopar.runtime.axis_ops import (
    apply_step,
    apply_steps,
    axis_name,
    owned,
    start_reduce_scatter,
)
from autopar.runtime.counter import CommCounter
from autopar.runtime.powersgd import LowRankReducer
from autopar.runtime.redistribution import Redistribution
from autopar.runtime.steps import Step

# Reduce-scatters of gathered parameters' gradients running at once; each holds the whole
# gradient it sends until it completes.
SCATTERS_IN_FLIGHT = 2

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
    split computation), or backward all-reduces alone of which the last is PowerSGD's
    (`Step.low_rank`): the ones `reduce_later` carries out for parameters."""
    # (A regathered edge without forward steps gathers nothing: the flag changes nothing.)
    steps = redistribution.backward_steps
    return (not redistribution.forward_steps and bool(steps)
            and all(step.kind == "all_reduce" for step in steps)
            and (len(steps) == 1 or steps[-1].low_rank > 0))


def scatterable(redistribution: Redistribution) -> bool:
    """Edges whose only collectives are one forward all-gather and one backward
    reduce-scatter on the same mesh axis (local steps may come before or after them; a
    `regather` edge gathers again for the backward, through the `Regather` scope): a
    parameter kept gathered (ZeRO-2) or gathered at its use (ZeRO-3) is read this way, and
    `gather_kept` carries such edges out. The planner charges the same edges' scatter as
    run in the background (`passes/problem/edge_costs.background_reductions`)."""
    forward = [s for s in redistribution.forward_steps if s.kind is not None]
    backward = [s for s in redistribution.backward_steps if s.kind is not None]
    return (len(forward) == 1 and len(backward) == 1
            and forward[0].kind == "all_gather" and backward[0].kind == "reduce_scatter"
            and forward[0].axis == backward[0].axis)


class GradientReducer:
    """The gradients waiting for their all-reduce in one backward pass; a plain object the
    caller owns. Each one starts its all-reduce at once (so it overlaps the backward) while
    the bucket of gradients on its axis is small; gradients arriving in a row are otherwise
    packed into one buffer, all-reduced in one call when the bucket is full or the backward
    ends: per-call cost, not bandwidth, dominates small all-reduces. Gradients of
    kept-gathered parameters (`scatter`) each start their reduce-scatter at once."""

    def __init__(self, bucket_bytes: int = GRADIENT_BUCKET_BYTES) -> None:
        self.bucket_bytes = bucket_bytes
        # By (mesh, axis, dtype): compressed gradients go in buckets of their own.
        self._buckets: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._meshes: dict[tuple, DeviceMesh] = {}
        # Started all-reduces: (parameters with their gradients' shapes, flat, work).
        self._in_flight: list[tuple[list[tuple[torch.Tensor, torch.Size]], torch.Tensor,
                                    object]] = []
        # Started reduce-scatters: (parameter, its chunk once waited on, work, the buffer
        # sent, the local steps after the scatter, mesh, counter).
        self._scatters: list[tuple] = []
        # Micro-batches: while deferring, replicated parameters' gradients are summed here
        # (by id: parameter, sum), and ZeRO-1 copies live for the step (by edge: the
        # shard, the copy, the edge's backward steps, mesh, counter).
        self.deferring = False
        self._deferred: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._whole: dict[int, tuple] = {}
        self._watching = False
        self.low_rank = LowRankReducer()  # PowerSGD's, with its state

    def _watch(self) -> None:
        # The first gradient of a backward pass: finish when the pass ends.
        if not self._watching:
            self._watching = True
            Variable._execution_engine.queue_callback(self.finish)

    def start(self, parameter: torch.Tensor, grad: torch.Tensor, axis: int,
              mesh: DeviceMesh, counter: CommCounter, *, owned: bool = False,
              reduce_dtype: torch.dtype | None = None, low_rank: int = 0,
              before: tuple[Step, ...] = ()) -> None:
        """Take `parameter`'s gradient `grad` to all-reduce over mesh axis `axis` (in
        `reduce_dtype` when given, as PowerSGD of rank `low_rank` when set: compressed),
        after the exact all-reduce `before` steps, run here; `owned`: nothing else holds
        `grad` (see `owns_gradient`), so it may be summed in place. While `deferring`,
        only add it to the sum reduced with the first gradient of `parameter` that
        arrives after."""
        held = self._deferred.pop(id(parameter), None)
        if held is not None:  # a copy of the earlier micro-batches' sum: ours to add into
            grad, owned = held[1].add_(grad), True
        if self.deferring:
            self._deferred[id(parameter)] = (parameter, grad if held is not None
                                             else grad.clone())
            return
        self._watch()
        if before:
            grad, owned = apply_steps(grad, before, mesh, counter, "backward"), True
        if low_rank:
            self.low_rank.start(parameter, grad, axis, low_rank, mesh, counter)
            return
        if reduce_dtype is not None and grad.dtype != reduce_dtype:
            grad, owned = grad.to(reduce_dtype), True  # cast back as it reaches `.grad`
        nbytes = grad.numel() * grad.element_size()
        counter.record("all_reduce", axis_name(mesh, axis), "backward", nbytes)
        if owned and nbytes >= self.bucket_bytes and grad.is_contiguous():
            self._all_reduce([(parameter, grad)], grad.view(-1), mesh, axis)
            return
        key = (id(mesh), axis, grad.dtype)
        self._meshes[key] = mesh
        bucket = self._buckets.setdefault(key, [])
        bucket.append((parameter, grad))
        if sum(g.numel() * g.element_size() for _, g in bucket) >= self.bucket_bytes:
            self._launch(key)

    def _launch(self, key: tuple) -> None:
        bucket = self._buckets.pop(key)
        mesh, axis = self._meshes[key], key[1]
        # A new buffer: the incoming gradients may be shared with other branches.
        self._all_reduce(bucket, torch.cat([g.reshape(-1) for _, g in bucket]), mesh, axis)

    def _all_reduce(self, bucket: list[tuple[torch.Tensor, torch.Tensor]], flat: torch.Tensor,
                    mesh: DeviceMesh, axis: int) -> None:
        """Start summing `flat` (`bucket`'s gradients end to end) in place over `axis`.
        Only the gradients' shapes are kept: each is freed once copied into `flat`."""
        work = dist.all_reduce(flat, group=mesh.get_group(axis), async_op=True)
        self._in_flight.append(([(p, g.shape) for p, g in bucket], flat, work))

    def whole_copy(self, key: int, shard: torch.Tensor, redistribution: Redistribution,
                   mesh: DeviceMesh, counter: CommCounter) -> torch.Tensor:
        """The step's copy of the parameter `shard` converted along `redistribution` (a
        `scatterable` edge, named by `key`): gathered at the first micro-batch, a leaf
        whose gradient accumulates over the micro-batches and is reduce-scattered into
        `shard.grad` once the last micro-batch's backward has made it (ZeRO-1)."""
        entry = self._whole.get(key)
        if entry is None:
            with torch.no_grad():
                copy = apply_steps(shard.detach(), redistribution.forward_steps, mesh,
                                   counter, "forward")
            copy.requires_grad_(True)
            copy.register_post_accumulate_grad_hook(lambda _, key=key: self._scatter_whole(key))
            entry = self._whole[key] = (shard, copy, redistribution.backward_steps, mesh,
                                        counter)
        return entry[1]

    def whole_copies(self, parameters: list[torch.Tensor]) -> list[torch.Tensor]:
        """The step's gathered copies (`whole_copy`) of any of `parameters` made so far."""
        ids = {id(p) for p in parameters}
        return [entry[1] for entry in self._whole.values() if id(entry[0]) in ids]

    def _scatter_whole(self, key: int) -> None:
        if self.deferring:
            return
        shard, copy, steps, mesh, counter = self._whole[key]
        grad, copy.grad = copy.grad, None
        self.scatter(shard, grad, steps, mesh, counter)

    def end_step(self) -> None:
        """Drop the step's ZeRO-1 copies (after the last micro-batch's backward)."""
        self._whole.clear()
        self.deferring = False

    def scatter(self, parameter: torch.Tensor, grad: torch.Tensor, steps: tuple[Step, ...],
                mesh: DeviceMesh, counter: CommCounter) -> None:
        """Take `grad`, the gradient of `parameter`'s gathered copy, to turn into the
        parameter's gradient by `steps` (a `scatterable` edge's backward steps: local ones
        and one reduce-scatter); the scatter starts now, recorded on `counter`."""
        self._watch()
        at = next(i for i, step in enumerate(steps) if step.kind == "reduce_scatter")
        for step in steps[:at]:  # local: nothing to record
            grad = apply_step(grad, step, mesh, counter, "backward")
        step = steps[at]
        while len(self._scatters) >= SCATTERS_IN_FLIGHT:
            self._complete(self._scatters.pop(0))
        if step.reduce_dtype is not None:  # compressed: cast back once the chunk is done
            grad = grad.to(step.reduce_dtype)
        chunk, work, sent = start_reduce_scatter(grad, step, mesh)
        counter.record("reduce_scatter", axis_name(mesh, step.axis), "backward",
                       sent.numel() * sent.element_size())
        self._scatters.append((parameter, chunk, work, sent, steps[at + 1:], mesh, counter))

    @staticmethod
    def _complete(scatter: tuple) -> None:
        """Wait for a started reduce-scatter and add its chunk to its parameter's `.grad`."""
        parameter, chunk, work, _, rest, mesh, counter = scatter
        work.wait()
        chunk = owned(apply_steps(chunk.to(parameter.dtype), rest, mesh, counter, "backward"))
        if parameter.grad is None:
            parameter.grad = chunk
        else:
            parameter.grad.add_(chunk)

    def finish(self) -> None:
        """Reduce what is left, wait for every all-reduce and reduce-scatter, add the
        results to the gradients."""
        self._watching = False
        for key in list(self._buckets):
            self._launch(key)
        scatters, self._scatters = self._scatters, []
        for scatter in scatters:
            self._complete(scatter)
        in_flight, self._in_flight = self._in_flight, []
        for bucket, flat, work in in_flight:
            work.wait()
            _hand_out(bucket, flat)
        self.low_rank.finish()


def _hand_out(bucket: list[tuple[torch.Tensor, torch.Size]], flat: torch.Tensor) -> None:
    """Add each of `bucket`'s summed gradients (end to end in `flat`, of the shapes the
    bucket lists) to its parameter's
    `.grad`. A `.grad` not yet set becomes a view into `flat` (a new buffer each step, so no
    later step writes into it): copying it out measured 2-3 ms per step on a 4 MB bucket,
    more than the whole gap to DDP. That holds no byte more than the gradients only when
    every slot of the bucket becomes a `.grad`; when some are added into an existing one
    (a parameter with a gradient already, or twice in the bucket), the others are copied
    out, so that `flat` is freed."""
    fresh = [parameter.grad is None for parameter, _ in bucket]
    share = all(fresh) and len({id(parameter) for parameter, _ in bucket}) == len(bucket)
    offset = 0
    for parameter, shape in bucket:
        summed = flat[offset:offset + shape.numel()].view(shape)
        offset += shape.numel()
        own = share
        if summed.dtype != parameter.dtype:  # reduced compressed: cast, a tensor of its own
            summed, own = summed.to(parameter.dtype), True
        if parameter.grad is None:
            parameter.grad = summed if own else summed.clone()
        else:
            parameter.grad.add_(summed)


class _ReduceLater(torch.autograd.Function):
    @staticmethod
    def forward(ctx, parameter: torch.Tensor, steps: tuple[Step, ...], mesh: DeviceMesh,
                counter: CommCounter, reducer: GradientReducer, owned: bool) -> torch.Tensor:
        # A leaf parameter held on ctx: no reference cycle through a grad_fn.
        ctx.parameter, ctx.steps, ctx.mesh = parameter, steps, mesh
        ctx.counter, ctx.reducer, ctx.owned = counter, reducer, owned
        return parameter.view_as(parameter)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        *before, step = ctx.steps
        ctx.reducer.start(ctx.parameter, grad, step.axis, ctx.mesh, ctx.counter,
                          owned=ctx.owned, reduce_dtype=step.reduce_dtype,
                          low_rank=step.low_rank, before=tuple(before))
        return None, None, None, None, None, None


def reduce_later(parameter: torch.Tensor, steps: tuple[Step, ...], mesh: DeviceMesh,
                 counter: CommCounter, reducer: GradientReducer, *, owned: bool = False
                 ) -> torch.Tensor:
    """`parameter` itself, whose gradient through this use `reducer` all-reduces as `steps`
    do (see the module docstring): the use's edge is `reducible`, `steps` its backward
    steps (the last over its axis, in its `reduce_dtype` when set, by PowerSGD when it has
    a `low_rank`; those before it exact, at once), as the caller checked once when it
    built the program. `owned`: the use's consumer op `owns_gradient`."""
    if not (parameter.requires_grad and torch.is_grad_enabled()):
        return parameter
    return _ReduceLater.apply(parameter, steps, mesh, counter, reducer, owned)


class _GatherKept(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard: torch.Tensor, redistribution: Redistribution, mesh: DeviceMesh,
                counter: CommCounter, reducer: GradientReducer,
                converted: torch.Tensor | None) -> torch.Tensor:
        # A leaf parameter held on ctx: no reference cycle through a grad_fn.
        ctx.parameter, ctx.steps, ctx.mesh = shard, redistribution.backward_steps, mesh
        ctx.counter, ctx.reducer = counter, reducer
        if converted is not None:
            return converted
        return apply_steps(shard, redistribution.forward_steps, mesh, counter, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.reducer.scatter(ctx.parameter, grad, ctx.steps, ctx.mesh, ctx.counter)
        return None, None, None, None, None, None


def gather_kept(shard: torch.Tensor, redistribution: Redistribution, mesh: DeviceMesh,
                counter: CommCounter, reducer: GradientReducer, *,
                converted: torch.Tensor | None = None) -> torch.Tensor:
    """`redistribute(shard, redistribution, ...)` for a parameter `shard` (this rank's
    piece, a leaf) whose edge is `scatterable`, as the caller checked: the forward gathers
    it the same way (or takes `converted`, gathered ahead), and the gradient of the result
    is reduce-scattered by `reducer` in the background of the rest of the backward, then
    added to `shard.grad` (see the module docstring)."""
    if not (shard.requires_grad and torch.is_grad_enabled()):
        if converted is not None:
            return converted
        return apply_steps(shard, redistribution.forward_steps, mesh, counter, "forward")
    return _GatherKept.apply(shard, redistribution, mesh, counter, reducer, converted)
