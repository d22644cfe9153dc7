"""Normalisations: layer_norm, native_layer_norm, rms_norm over trailing dims; group_norm,
instance_norm.

Statistics are taken over the `normalized_shape` trailing dims, so those stay whole; each
leading dim (batch, sequence) can be split, with the affine weight and bias `R`. Not linear:
no `P`. native_layer_norm's mean and rstd keep the leading dims, so they share the split.

group_norm (x = [N, C, *space]) takes statistics per sample over each group of channels and
all of space: only the batch splits (exactly, with weight and bias `R`). A channel split is
exact only when the number of chunks divides `num_groups` (each rank then normalises whole
groups, with a local `num_groups`), which a rule cannot check; it is not offered.

instance_norm (nn.InstanceNormNd) takes statistics per sample and channel over space: the
batch and channel dims split (the [C] weight, bias and running statistics split with the
channels). With running statistics used (use_input_stats False) it is a per-channel affine
map and space splits too. Running statistics updated from the batch (use_input_stats with
running_mean given) would be updated per rank from its own samples: no split is offered.
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


def _instance_norm(op: OpSpec) -> list[AxisStrategy]:
    x = argument(op, "input")
    use_input = bool(argument(op, "use_input_stats", True))
    if use_input and argument(op, "running_mean") is not None:
        return []
    channels = {n: S(0) for n in ("weight", "bias", "running_mean", "running_var")}
    strategies = [by_name(op, {"input": S(d)}, S(d)) for d in range(x.ndim)
                  if (d == 0 or d > 1 and not use_input) and x.shape[d] > 1]
    if x.ndim > 1 and x.shape[1] > 1:
        strategies.append(by_name(op, {"input": S(1), **channels}, S(1)))
    return finish(strategies)


RULES: dict[object, Rule] = {
    aten.layer_norm.default: _leading,
    aten.native_layer_norm.default: _leading,
    aten.rms_norm.default: _leading,
    aten.group_norm.default: _batch,
    aten.instance_norm.default: _instance_norm,
}
