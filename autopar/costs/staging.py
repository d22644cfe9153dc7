"""Staging buffers: what a redistribution holds for a moment beyond the tensor it hands
on, one rank's bytes. Each collective step of `autopar.runtime.axis_ops`, with a the rank's
bytes before it and b after it:

    all_reduce                          0   (reduces a copy in place: the copy is the result)
    all_gather, reduce_scatter, dim 0   0   (into the result, from the input itself)
    all_gather along another dim        b   (gathered along dim 0, then laid out: both held)
    reduce_scatter along another dim    a   (the input laid out along dim 0 first)
    all_to_all                          a   (the pieces sent, then those received, beside
                                             the result they are laid out into)

A conversion of several steps also holds each step's result while the next one runs, so
over steps i = 1..k (s_i the staging above)

    staging = max_i ([i > 1] a_i + s_i + b_i) - b_k

The input is not counted (its producer holds it), nor is the result (the consumer's
read, charged as such); local steps (slicing, zero-filling) stage nothing beyond them.
"""

from __future__ import annotations

from autopar.costs.formulas import axis_collective, conversion_steps, local_bytes
from autopar.values.placement import Placements, Shard


def step_staging(kind: str | None, dim: int, before: float, after: float) -> float:
    """The staging of one step of `kind` (None: local) along `dim`, `before` and `after`
    bytes on the rank (module docstring)."""
    if kind == "all_to_all":
        return before
    if dim == 0 or kind in (None, "all_reduce"):
        return 0.0
    return after if kind == "all_gather" else before


def staging_bytes(nbytes: float, src: Placements, dst: Placements,
                  mesh_shape: tuple[int, ...]) -> float:
    """One rank's staging bytes (module docstring) of turning a tensor of `nbytes` (global)
    placed `src` into `dst`; 0 when no sequence of single-axis collectives does it."""
    steps = conversion_steps(src, dst)
    if not steps:
        return 0.0
    current = list(src)
    peak = result = 0.0
    for position, (axis, before_placement, after_placement) in enumerate(steps):
        before = local_bytes(nbytes, tuple(current), mesh_shape)
        current[axis] = after_placement
        result = local_bytes(nbytes, tuple(current), mesh_shape)
        moved = after_placement if isinstance(after_placement, Shard) else before_placement
        dim = moved.dim if isinstance(moved, Shard) else 0
        staged = step_staging(axis_collective(before_placement, after_placement), dim,
                              before, result)
        peak = max(peak, (before if position else 0.0) + staged + result)
    return max(0.0, peak - result)
