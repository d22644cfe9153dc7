"""The per-axis steps of a redistribution, in the order the cost model charges them.

`redistribution_steps(src, dst, ...)` turns one sharding into another one mesh axis at a time, in
the order `autopar.costs.formulas.conversion_steps` fixes (the order decides which axis moves how
many bytes, so the runtime takes it from the cost model rather than restating it). Each step is
one of

    P -> R      all_reduce              R -> S(d)     local chunk (own coordinate's piece)
    P -> S(d)   reduce_scatter along d  R -> P        value on coordinate 0, zeros elsewhere
    S(d) -> R   all_gather along d      S(d) -> P     own chunk in place, zeros elsewhere
    S(d) -> S(e) all_to_all             (same placement: no step)

A dim sharded over several axes is cut outer axis first: on axes (a, b), a < b, a rank holds
chunk i_a * n_b + i_b (DTensor's order). A step is one collective only when its axis is the
innermost one sharding the dims it touches; otherwise `UnsupportedRedistributionError`.
Pieces follow DTensor's chunking, or the mesh's shares on an axis that has them
(`autopar.values.placement`), so a dim need not divide: a step knows the tensor's global
shape, its placements before the step and the shares, from which a rank works out the
pieces' lengths (`Step.whole`, `Step.lengths`). A step of a parameter's compressed
collective says how (`autopar.values.compression`): a reduction the dtype it runs in
(`Step.reduce_dtype`), a gather that it moves int8 blocks (`Step.quantized`), a gradient's
all-reduce PowerSGD's rank (`Step.low_rank`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from autopar.costs.formulas import axis_collective, conversion_steps
from autopar.errors import ShardingError
from autopar.runtime.errors import UnsupportedRedistributionError
from autopar.values.compression import Compression, compresses_matrix
from autopar.values.placement import (
    Partial,
    Placement,
    Placements,
    Replicate,
    Shard,
    Shares,
    chunk_sizes,
    format_placement,
    format_placements,
    local_shape,
)


@dataclass(frozen=True)
class Step:
    """Change the placement on mesh axis `axis` from `src` to `dst` (they differ)."""

    axis: int
    src: Placement
    dst: Placement
    # The tensor's global shape, its placements before the step and the mesh's shares:
    # what sizes its pieces.
    shape: tuple[int, ...] = field(default=(), compare=False)
    before: Placements = field(default=(), compare=False)
    shares: Shares = field(default=None, compare=False)
    # A parameter's compressed collective (`autopar.values.compression`): a reduction
    # (all-reduce, reduce-scatter) runs in `reduce_dtype` when set; an all-gather moves int8
    # blocks when `quantized`; an all-reduce sends a PowerSGD approximation of `low_rank`.
    reduce_dtype: torch.dtype | None = field(default=None, compare=False)
    quantized: bool = field(default=False, compare=False)
    low_rank: int = field(default=0, compare=False)
    # The collective this step performs; None for the local ones. Derived once: the runtime
    # reads it on every call.
    kind: str | None = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", axis_collective(self.src, self.dst))

    def whole(self, dim: int, mesh_shape: tuple[int, ...], coordinate: tuple[int, ...]) -> int:
        """The size of `dim` over the step's axis group at `coordinate`: what the group's
        pieces of it add up to (the dim's size with this axis replicated)."""
        placements = list(self.before)
        placements[self.axis] = Replicate()
        return local_shape(self.shape, tuple(placements), mesh_shape, coordinate,
                           self.shares)[dim]

    def lengths(self, whole: int, n: int) -> tuple[int, ...]:
        """The lengths of the `n` pieces a dim of `whole` is cut into over the step's axis."""
        return chunk_sizes(whole, n, None if self.shares is None else self.shares[self.axis])

    def __str__(self) -> str:
        return f"axis {self.axis}: {format_placement(self.src)} -> {format_placement(self.dst)}"


def check_placements(placements: Placements, shape: tuple[int, ...],
                     mesh_shape: tuple[int, ...]) -> None:
    """Raise unless `placements` is one supported placement per axis, each Shard of a dim
    of the tensor."""
    text = format_placements(placements) if placements else "()"
    if len(placements) != len(mesh_shape):
        raise ShardingError("placements do not match the mesh",
                            expected=f"{len(mesh_shape)} placements for mesh {mesh_shape}",
                            got=text, fix="give one placement per mesh axis")
    for placement in placements:
        if isinstance(placement, Shard) and not 0 <= placement.dim < len(shape):
            raise ShardingError("Shard dim out of range",
                                expected=f"dims 0..{len(shape) - 1} of shape {shape}",
                                got=text, fix="use a non-negative dim of the tensor")
        if isinstance(placement, Partial) and placement.reduce_op != "sum":
            raise UnsupportedRedistributionError(
                "only Partial('sum') is supported", expected="P", got=text,
                fix="reduce with sum, or replicate the tensor")
        if not isinstance(placement, Shard | Replicate | Partial):
            raise ShardingError("unknown placement", expected="Shard, Replicate or Partial",
                                got=repr(placement), fix="use autopar.values.placement's types")


def redistribution_steps(src: Placements, dst: Placements, shape: tuple[int, ...],
                         mesh_shape: tuple[int, ...], shares: Shares = None,
                         compression: Compression | None = None, *, backward: bool = True
                         ) -> tuple[Step, ...]:
    """The steps turning `src` into `dst`, validated against `shape` and `mesh_shape`,
    pieces cut by the mesh's `shares`, a parameter's collectives compressed by
    `compression` (its gathers in the forward, its gradient's reductions in the
    `backward`)."""
    check_placements(src, shape, mesh_shape)
    check_placements(dst, shape, mesh_shape)
    steps = conversion_steps(src, dst)
    if steps is None:
        # A dim's piece must be a contiguous chunk of what each single-axis step produces.
        raise UnsupportedRedistributionError(
            f"{format_placements(src)} -> {format_placements(dst)} is not a sequence of "
            "single-axis collectives",
            expected="steps on the innermost axis sharding each dim they touch",
            got=f"{format_placements(src)} -> {format_placements(dst)}",
            fix="plan the edge through a placement that unshards the inner axes first")
    current, out = list(src), []
    for axis, before, after in steps:
        out.append(Step(axis, before, after, tuple(shape), tuple(current), shares))
        current[axis] = after
    if compression is None:
        return tuple(out)
    return _compressed(tuple(out), compression, backward, mesh_shape)


def _compressed(steps: tuple[Step, ...], compression: Compression, backward: bool,
                mesh_shape: tuple[int, ...]) -> tuple[Step, ...]:
    """`steps` marked to run as `compression` does (`Step`'s fields; the same collectives
    `autopar.costs.compression.compressed_transfers` charges compressed)."""
    kinds = [step.kind for step in steps if step.kind is not None]
    if "reduce" in compression.kinds and backward:
        steps = tuple(dataclasses.replace(s, reduce_dtype=compression.reduce_dtype)
                      if s.kind in ("all_reduce", "reduce_scatter") else s for s in steps)
    if "gather" in compression.kinds and not backward:
        steps = tuple(dataclasses.replace(s, quantized=True) if s.kind == "all_gather" else s
                      for s in steps)
    if "low-rank" in compression.kinds and backward and steps \
            and kinds == ["all_reduce"] * len(steps) and compresses_matrix(local_shape(
                steps[-1].shape, steps[-1].before, mesh_shape), compression.rank):
        # The last all-reduce (the outermost axis) approximated, those before it exact.
        return (*steps[:-1], dataclasses.replace(steps[-1], low_rank=compression.rank))
    return steps
