"""`redistribute`: the autograd-aware collective the lowering puts on every resharded edge.

Forward converts a rank's local piece from `redistribution.src` to `.dst`; backward converts
the gradient from `.grad_arriving` to `.grad_needed`, both axis by axis in the order and with
the collectives `autopar.costs.formulas.edge_transfers` charged for the edge (see `steps.py`). This
is docs/DESIGN.md's backward table made code: Megatron's copy/reduce/scatter/gather regions for any
axis and any pair of placements. Each collective is counted on the caller's `CommCounter`.

Regathered parameter edges (`redistribution.regather`) also need a `Regather` scope: the
forward's gathered tensor is then not kept for backward but gathered again when needed,
from the stored piece or ("hpz") from a copy cut out of it (`redistribution.keep_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.distributed.device_mesh import DeviceMesh

from autopar.runtime.axis_ops import apply_steps, piece_of
from autopar.runtime.counter import CommCounter
from autopar.runtime.errors import RedistributionError
from autopar.runtime.grad_reduce import (
    GradientReducer,
    gather_kept,
    reduce_later,
    reducible,
    scatterable,
)
from autopar.runtime.pending import pending_reducible, reduce_output
from autopar.runtime.prefetch import Prefetch, prefetchable
from autopar.runtime.redistribution import Redistribution
from autopar.runtime.regather import Regather
from autopar.values.placement import Replicate, Shard, format_placements, local_shape


class _Redistribute(torch.autograd.Function):
    # Linear in its input, so nothing is saved: backward needs only the placements.

    @staticmethod
    def forward(ctx, x: torch.Tensor, redistribution: Redistribution, mesh: DeviceMesh,
                counter: CommCounter, converted: torch.Tensor | None) -> torch.Tensor:
        ctx.redistribution, ctx.mesh, ctx.counter = redistribution, mesh, counter
        if converted is not None:  # gathered ahead (autopar.runtime.prefetch)
            return converted
        return apply_steps(x, redistribution.forward_steps, mesh, counter, "forward")

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        steps = ctx.redistribution.backward_steps
        return (apply_steps(grad, steps, ctx.mesh, ctx.counter, "backward"),
                None, None, None, None)


def _check(x: torch.Tensor, r: Redistribution, mesh: DeviceMesh,
           regather: Regather | None, differentiable: bool) -> None:
    if tuple(mesh.shape) != r.mesh_shape:
        raise RedistributionError("the device mesh differs from the edge's mesh",
                                  expected=f"mesh shape {r.mesh_shape}",
                                  got=f"{tuple(mesh.shape)}", fix="use the plan's mesh")
    expected = local_shape(r.shape, r.src, r.mesh_shape, tuple(mesh.get_coordinate()),
                           r.shares)
    if tuple(x.shape) != expected or x.dtype != r.dtype:
        raise RedistributionError(
            f"local tensor does not fit {format_placements(r.src)} of global shape {r.shape}",
            expected=f"shape {expected}, dtype {r.dtype}",
            got=f"shape {tuple(x.shape)}, dtype {x.dtype}",
            fix="pass this rank's piece of the tensor in the source placement")
    if differentiable and not r.requires_grad:
        raise RedistributionError(
            "tensor requires grad but the edge was built without a backward",
            expected="Redistribution.for_edge(..., requires_grad=True)",
            got="requires_grad=False", fix="rebuild the edge with requires_grad=True, "
            "or detach the tensor")
    if differentiable and r.regather and regather is None and any(
            s.kind == "all_gather" for s in r.forward_steps):
        raise RedistributionError(
            "a regathered parameter edge needs a Regather scope",
            expected="redistribute(..., regather=scope) inside `with scope:`",
            got="regather=None", fix="create autopar.runtime.Regather() and pass it")


def redistribute(x: torch.Tensor, redistribution: Redistribution, mesh: DeviceMesh,
                 counter: CommCounter, *, regather: Regather | None = None,
                 converted: torch.Tensor | None = None) -> torch.Tensor:
    """This rank's piece of `x` converted from `redistribution.src` to `.dst`.

    `x` is the local piece of a tensor of global shape `redistribution.shape` laid out as
    `src` on `mesh` (a torch DeviceMesh of shape `redistribution.mesh_shape`; a Partial
    piece holds one summand). Differentiable: the gradient of the result, laid out as
    `grad_arriving`, comes back laid out as `grad_needed`. Forward and backward collectives
    are recorded on `counter` and equal `redistribution.forward`/`.backward` in bytes.
    Collective, like any torch.distributed call: every rank of the mesh calls it in the same
    order with the same `redistribution`. `converted`: the forward's result, already
    computed by a gather started ahead (`autopar.runtime.prefetch`, which recorded it).
    """
    differentiable = x.requires_grad and torch.is_grad_enabled()
    _check(x, redistribution, mesh, regather, differentiable)
    if not differentiable:  # an autograd node would only cost time (inputs, targets)
        if converted is not None:
            return converted
        return apply_steps(x, redistribution.forward_steps, mesh, counter, "forward")
    out = _Redistribute.apply(x, redistribution, mesh, counter, converted)
    if differentiable and redistribution.regather and regather is not None and any(
            s.kind == "all_gather" for s in redistribution.forward_steps):
        track_regather(out, x, redistribution, regather, mesh, counter)
    return out


def track_regather(out: torch.Tensor, x: torch.Tensor, redistribution: Redistribution,
                   regather: Regather, mesh: DeviceMesh, counter: CommCounter) -> None:
    """Let `regather` rebuild `out` (gathered from this rank's piece `x` by
    `redistribution`) in the backward: from `x` again, or ("hpz") from a copy cut out of
    `out` now (`redistribution.keep_steps`), gathered back by `.regather_steps`."""
    if redistribution.regather_from is None:
        regather.track(out, x, redistribution.forward_steps, mesh, counter)
        return
    with torch.no_grad():
        kept = apply_steps(out, redistribution.keep_steps, mesh, counter, "forward")
    regather.track(out, kept, redistribution.regather_steps, mesh, counter)


@dataclass(frozen=True, eq=False)
class RankContext:
    """What a rank's collectives run on: its DeviceMesh, the counter they record into and
    the scope that regathers sharded parameters for the backward. One per compiled program."""

    mesh: DeviceMesh
    counter: CommCounter = field(default_factory=CommCounter)
    regather: Regather = field(default_factory=Regather)
    reducer: GradientReducer = field(default_factory=GradientReducer)
    prefetch: Prefetch = field(default_factory=Prefetch)


def _local_slice(redistribution: Redistribution, mesh: DeviceMesh | None
                 ) -> tuple[int, int, int, tuple[int, ...] | None] | None:
    """(dim, pieces, this rank's index, the axis's shares) when the edge's forward is one
    local `R -> S(dim)` step, else None (also without a mesh: a program only shown, never
    run)."""
    steps = redistribution.forward_steps
    if mesh is None or len(steps) != 1 or steps[0].kind is not None \
            or not isinstance(steps[0].dst, Shard) or not isinstance(steps[0].src, Replicate):
        return None
    axis, shares = steps[0].axis, redistribution.shares
    return (steps[0].dst.dim, mesh.size(axis), mesh.get_local_rank(axis),
            None if shares is None else shares[axis])


class Collective(nn.Module):
    """One graph edge's `redistribute` as a module, so that a rank program's code names it:
    `linear_1__R_S0 = self.linear_1__R_S0(linear_1)`. Holds no state. With `overlapped`
    (a parameter whose edge only all-reduces its gradient), the all-reduce runs in the
    background of the backward (`autopar.runtime.grad_reduce`); with `kept_gathered` (a
    parameter gathered for its use, kept or gathered again for the backward, whose edge is
    one all-gather and one reduce-scatter), the gradient's reduce-scatter does too, and
    with `whole_gradient` as well the gathered copy serves every micro-batch of the step
    (ZeRO-1, `GradientReducer.whole_copy`); with `output` (an edge into the program's
    outputs that only all-reduces), the result is a `PendingSum` whose all-reduce runs in
    the background too (`autopar.runtime.pending`)."""

    def __init__(self, redistribution: Redistribution, context: RankContext, *,
                 overlapped: bool = False, owned_gradient: bool = False,
                 kept_gathered: bool = False, whole_gradient: bool = False,
                 output: bool = False) -> None:
        """`owned_gradient`: with `overlapped`, the consumer op `owns_gradient`."""
        super().__init__()
        self.redistribution, self.context, self.overlapped = redistribution, context, overlapped
        self.kept_gathered, self.whole_gradient = kept_gathered, whole_gradient
        assert not kept_gathered or scatterable(redistribution), redistribution
        self.owned_gradient = overlapped and owned_gradient
        self.output = output and pending_reducible(redistribution)
        # Resolved once: the program calls its collectives on every step, and what they
        # check and look up here is fixed when the program is built.
        if overlapped:
            assert reducible(redistribution), redistribution
            self._reduction = redistribution.backward_steps
        self._slice = _local_slice(redistribution, context.mesh)
        self.prefetched = False  # its gather is started by the edge before it (`chain`)
        self._upcoming: tuple[Collective, ...] = ()  # a tuple: not a registered submodule

    def chain(self, upcoming: Collective) -> None:
        """Start `upcoming`'s gather, from the shard the program then passes as `forward`'s
        second argument, each time this edge has run (`autopar.runtime.prefetch`)."""
        assert prefetchable(upcoming.redistribution), upcoming.redistribution
        self._upcoming, upcoming.prefetched = (upcoming,), True

    def forward(self, x: torch.Tensor, upcoming_shard: torch.Tensor | None = None
                ) -> torch.Tensor:
        out = self._convert(x)
        if upcoming_shard is not None:
            upcoming = self._upcoming[0]
            self.context.prefetch.start(id(upcoming), upcoming_shard, upcoming.redistribution,
                                        self.context.mesh, self.context.counter)
        return out

    def _convert(self, x: torch.Tensor) -> torch.Tensor:
        if self.output:
            return reduce_output(x, self.redistribution, self.context.mesh,
                                 self.context.counter)
        if self.whole_gradient and x.requires_grad and torch.is_grad_enabled():
            return self.context.reducer.whole_copy(id(self), x, self.redistribution,
                                                   self.context.mesh, self.context.counter)
        converted = self.context.prefetch.take(id(self)) if self.prefetched else None
        if self.kept_gathered:
            out = gather_kept(x, self.redistribution, self.context.mesh, self.context.counter,
                              self.context.reducer, converted=converted)
            if self.redistribution.regather and out.requires_grad:
                track_regather(out, x, self.redistribution, self.context.regather,
                               self.context.mesh, self.context.counter)
            return out
        if self.overlapped:
            return reduce_later(x, self._reduction, self.context.mesh, self.context.counter,
                                self.context.reducer, owned=self.owned_gradient)
        if self._slice is not None and not (x.requires_grad and torch.is_grad_enabled()):
            # An input's piece: no autograd, no collective.
            return piece_of(x, *self._slice).contiguous()
        if not self.redistribution.requires_grad:
            # The consumer passes no gradient back (an integer tensor, or `zeros_like(x)`).
            x = x.detach()
        return redistribute(x, self.redistribution, self.context.mesh, self.context.counter,
                            regather=self.context.regather, converted=converted)

    def extra_repr(self) -> str:
        return str(self.redistribution)
