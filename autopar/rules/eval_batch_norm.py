"""Batch normalisation in eval mode (running statistics), rewritten as the per-channel affine
map it is, so that the elementwise rules split it.

nn.BatchNormNd in eval mode (with `track_running_stats`) exports to
`_native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
momentum, eps) -> (out, save_mean, save_invstd)`, input = [N, C, *space], the others [C]:

    out = (x - running_mean[c]) * rsqrt(running_var[c] + eps) * weight[c] + bias[c]

Nothing is taken over the batch, so the batch and spatial dims split exactly with the [C]
tensors `R`, and the channel dim with them split on C. No rule can say so for the op itself:
its other two outputs are empty ([0], on CPU) or [C] (on other devices), and the contract
gives every output of an op one placement, which no split of the input fits. Written as
`sub`, `mul`, `add` of x with the [C] tensors unsqueezed to [C, 1, ...], the pointwise
rules offer exactly the splits above (x `S(1)` with the [C] tensors `S(0)`; x `S(0)` or a
spatial split with them `R`), and `P` through the affine map where it is linear.

The rewrite follows torch's own decomposition (`torch._decomp`): statistics in the
computation dtype (float32 for half inputs), x centred before scaling (the weight's gradient
is a sum of g * (x - mean), without cancellation), output cast back to x's dtype. The
unused extra outputs are what the op returns on the device: [0] on CPU, running_mean and
invstd elsewhere. `DECOMPOSITIONS` is merged into `autopar.rules.DECOMPOSITIONS`, which
capture applies. Training mode (`_native_batch_norm_legit_functional`) is not touched.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._prims_common import get_computation_dtype

aten = torch.ops.aten


def _per_channel(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """A [C] tensor shaped to broadcast over dim 1 of an ndim-d input: [C, 1, ...]."""
    for _ in range(ndim - 2):
        t = aten.unsqueeze.default(t, -1)
    return t


def _batch_norm_eval(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                     running_mean: torch.Tensor, running_var: torch.Tensor, momentum: float,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = get_computation_dtype(x.dtype)
    mean = running_mean if running_mean.dtype == dtype else running_mean.to(dtype)
    var = running_var if running_var.dtype == dtype else running_var.to(dtype)
    invstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
    scale = invstd if weight is None else aten.mul.Tensor(invstd, weight)
    out = aten.mul.Tensor(aten.sub.Tensor(x, _per_channel(mean, x.ndim)),
                          _per_channel(scale, x.ndim))
    if bias is not None:
        out = aten.add.Tensor(out, _per_channel(bias, x.ndim))
    if out.dtype != x.dtype:
        out = out.to(x.dtype)
    if x.device.type == "cpu":
        return out, x.new_zeros((0,)), x.new_zeros((0,))
    return out, aten.clone.default(mean), invstd


DECOMPOSITIONS: dict[object, Callable] = {
    aten._native_batch_norm_legit_no_training.default: _batch_norm_eval,
}
