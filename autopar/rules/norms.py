"""Normalisations over trailing dims: layer_norm, native_layer_norm, rms_norm.

Statistics are taken over the `normalized_shape` trailing dims, so those stay whole; each
leading dim (batch, sequence) can be split, with the affine weight and bias `R`. Not linear:
no `P`. native_layer_norm's mean and rstd keep the leading dims, so they share the split.
"""

from __future__ import annotations

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import S, argument, by_name, finish

aten = torch.ops.aten


def _leading(op: OpSpec) -> list[AxisStrategy]:
    src = op.inputs[0]
    leading = src.ndim - len(argument(op, "normalized_shape"))
    return finish(by_name(op, {"input": S(d)}, S(d)) for d in range(leading)
                  if src.shape[d] > 1)


RULES: dict[object, Rule] = {
    aten.layer_norm.default: _leading,
    aten.native_layer_norm.default: _leading,
    aten.rms_norm.default: _leading,
}
