"""Pooling over 1-3 spatial dims: max_pool (and with_indices), avg_pool, adaptive_avg_pool,
adaptive_max_pool, what nn.MaxPoolNd, AvgPoolNd, AdaptiveAvgPoolNd, AdaptiveMaxPoolNd, LPPool
(as pow + avg_pool) and F.interpolate(mode="area") export to.

Each output element reduces a window of one plane of the input:
`out[n, c, i] = reduce(x[n, c, window(i)])`, x = [N, C, *space], or [C, *space] unbatched.
The planes are independent, so over one mesh axis:

- batch (data parallel) and channels: x `S(d)` -> output `S(d)` for every dim d before the
  spatial ones (the op runs unchanged on the planes a rank holds). For the with-indices ops
  both outputs share the split: an index is a position within its own plane, which a rank
  holds whole, so local indices are the global ones;
- avg_pool and adaptive_avg_pool are linear in x: `P -> P`. Max pools are not.

Spatial dims are never split: a window at a chunk's border reads the neighbour's rows (a
halo exchange the lowering does not do), and an adaptive window's bounds depend on the
global size.
"""

from __future__ import annotations

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import P, S, finish, is_float

aten = torch.ops.aten


def planes(spatial: int, linear: bool) -> Rule:
    """Rule for a one-input op on the last `spatial` dims of its input, each plane (an index
    of the leading dims) on its own; `linear`: the op is linear in the input (`P -> P`)."""

    def rule(op: OpSpec) -> list[AxisStrategy]:
        (src,) = op.inputs
        strategies = [AxisStrategy((S(d),), S(d)) for d in range(src.ndim - spatial)
                      if src.shape[d] > 1]
        if linear and is_float(src) and all(map(is_float, op.outputs)):
            strategies.append(AxisStrategy((P,), P))
        return finish(strategies)

    return rule


def _table() -> dict[object, Rule]:
    rules: dict[object, Rule] = {}
    for k in (1, 2, 3):
        rules[getattr(aten, f"max_pool{k}d").default] = planes(k, linear=False)
        rules[getattr(aten, f"max_pool{k}d_with_indices").default] = planes(k, linear=False)
        rules[getattr(aten, f"avg_pool{k}d").default] = planes(k, linear=True)
        rules[getattr(aten, f"adaptive_avg_pool{k}d").default] = planes(k, linear=True)
        rules[getattr(aten, f"adaptive_max_pool{k}d").default] = planes(k, linear=False)
    rules[aten._adaptive_avg_pool2d.default] = planes(2, linear=True)
    rules[aten._adaptive_avg_pool3d.default] = planes(3, linear=True)
    return rules


RULES: dict[object, Rule] = _table()
