"""Normalisations: layer_norm, native_layer_norm, rms_norm over trailing dims; group_norm.

Statistics are taken over the `normalized_shape` trailing dims, so those stay whole; each
leading dim (batch, sequence) can be split, with the affine weight and bias `R`. Not linear:
no `P`. native_layer_norm's mean and rstd keep the leading dims, so they share the split.

group_norm (x = [N, C, *space]) takes statistics per sample over each group of channels and
all of space: only the batch splits (exactly, with weight and bias `R`). A channel split is
exact only when the number of chunks divides `num_groups` (each rank then normalises whole
groups, with a local `num_groups`), which a rule cannot check; it is not offered.
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


def _batch(op: OpSpec) -> list[AxisStrategy]:
    src = op.inputs[0]
    return finish([by_name(op, {"input": S(0)}, S(0))] if src.shape[0] > 1 else [])


RULES: dict[object, Rule] = {
    aten.layer_norm.default: _leading,
    aten.native_layer_norm.default: _leading,
    aten.rms_norm.default: _leading,
    aten.group_norm.default: _batch,
}
