"""Interpolation (F.interpolate, nn.Upsample): upsample_nearest{1,2,3}d,
_upsample_nearest_exact{1,2,3}d, upsample_linear1d, upsample_bilinear2d, upsample_bicubic2d,
upsample_trilinear3d and the antialiased _upsample_{bilinear,bicubic}2d_aa, in their `.vec`
form (what export emits, with output_size or scale_factors) and their `.default` form.

Each output element is a fixed weighted sum of a few input elements of the same plane:
`out[n, c, i] = sum_t w(i, t) * x[n, c, src(i, t)]`, x = [N, C, *space], where the taps and
weights depend only on the spatial sizes (and scales, align_corners), never on values. So:

- batch and channels: x `S(d)` -> output `S(d)`, d in (0, 1); the sizes and scale factors
  are spatial, the same on every rank;
- the op is linear in x (nearest is a gather, the others fixed weighted sums): `P -> P`.

Spatial dims are never split: the source positions of a chunk of the output are computed
from global sizes and may fall in a neighbour's chunk (bilinear and bicubic read across the
border, and the scale maps output chunk borders to non-integer input positions).
"""

from __future__ import annotations

import torch

from autopar.rules.base import Rule
from autopar.rules.pooling import planes

aten = torch.ops.aten

# Op name -> number of spatial dims it interpolates.
_OPS = {
    "upsample_nearest1d": 1, "upsample_nearest2d": 2, "upsample_nearest3d": 3,
    "_upsample_nearest_exact1d": 1, "_upsample_nearest_exact2d": 2,
    "_upsample_nearest_exact3d": 3, "upsample_linear1d": 1, "upsample_bilinear2d": 2,
    "upsample_bicubic2d": 2, "upsample_trilinear3d": 3, "_upsample_bilinear2d_aa": 2,
    "_upsample_bicubic2d_aa": 2,
}


def _table() -> dict[object, Rule]:
    rules: dict[object, Rule] = {}
    for name, spatial in _OPS.items():
        packet = getattr(aten, name)
        rules[packet.vec] = planes(spatial, linear=True)
        rules[packet.default] = planes(spatial, linear=True)
    return rules


RULES: dict[object, Rule] = _table()
