"""Staging buffers: what a redistribution holds for a moment beyond the tensor it hands
on, one rank's bytes, as `autopar.runtime.axis_ops.apply_steps` runs its steps. With a a
step's bytes before and b after:

    all_reduce                    b          (reduces a copy in place)
    all_gather, reduce_scatter    c + b      (into one buffer, along dim 0: the input is
                                              first laid out dim first, a copy c = a,
                                              unless it already is)
    all_to_all                    2a, then a + b   (the pieces sent and those received;
                                              then those received and the result laid out
                                              from them, a view of them when the source
                                              dim is 0)
    local (slice, zero-fill)      b

A gather or reduce-scatter along a dim d other than 0 leaves its result laid out d first
(a view of its buffer): the next such step along d reads it as it is, and the conversion
ends with a copy into the usual layout, b held twice. Each step also holds its input
while it runs when that is an earlier step's result (the conversion's own input is its
producer's). Over the steps, the staging is the most held at once less the result:

    staging = max over the steps (and the last copy) of what is held - b_last
"""

from __future__ import annotations

from autopar.costs.formulas import axis_collective, conversion_steps, local_bytes
from autopar.values.placement import Placements, Shard


def staging_bytes(nbytes: float, src: Placements, dst: Placements,
                  mesh_shape: tuple[int, ...]) -> float:
    """One rank's staging bytes (module docstring) of turning a tensor of `nbytes` (global)
    placed `src` into `dst`; 0 when no sequence of single-axis collectives does it."""
    steps = conversion_steps(src, dst)
    if not steps:
        return 0.0
    current = list(src)
    front = None  # the dim the current tensor is laid out first along (None: as usual)
    peak = result = 0.0
    for position, (axis, before_placement, after_placement) in enumerate(steps):
        before = local_bytes(nbytes, tuple(current), mesh_shape)
        current[axis] = after_placement
        result = local_bytes(nbytes, tuple(current), mesh_shape)
        kind = axis_collective(before_placement, after_placement)
        held = (before if position else 0.0) + result
        if kind == "all_to_all":
            held += before
            front = None
        elif kind in ("all_gather", "reduce_scatter"):
            dim = (after_placement if isinstance(after_placement, Shard)
                   else before_placement).dim
            if front != dim and not (dim == 0 and front is None):
                held += before
            front = None if dim == 0 else dim
        else:
            front = None
        peak = max(peak, held)
    if front is not None:
        peak = max(peak, 2 * result)
    return max(0.0, peak - result)
