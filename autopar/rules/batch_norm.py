"""Batch normalisation, rewritten as the reductions and per-channel affine maps it is, so
that the reduction and pointwise rules split it: in training mode with the statistics of the
whole batch (as SyncBatchNorm computes them), in eval mode with the running statistics.

nn.BatchNormNd exports, input x = [N, C, *space] and the others [C], to

- training, running statistics tracked: `_native_batch_norm_legit_functional(x, weight,
  bias, running_mean, running_var, training=True, momentum, eps) -> (out, save_mean,
  save_invstd, new_running_mean, new_running_var)`;
- training, none tracked: `_native_batch_norm_legit.no_stats(x, weight, bias, training,
  momentum, eps) -> (out, save_mean, save_invstd)`;
- eval: `_native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var,
  momentum, eps) -> (out, save_mean, save_invstd)`.

No rule can split these ops as they are: the contract gives every output of an op one
placement, and the [N, C, ...] output and the [C] statistics take different ones under any
split of the batch. Rewritten, with R = the reduced dims (0 and the spatial ones) and
n = the number of elements per channel (global, a constant of the graph):

    mean    = sum_R(x) / n                       (training)
    var     = sum_R((x - mean)^2) / n            (biased; two passes, as torch computes it)
    out     = (x - mean) * rsqrt(var + eps) * weight[c] + bias[c]
    running = (1 - momentum) * running + momentum * (mean, var * n / (n - 1))

Under a batch or spatial split each `sum_R` is `P`, and the solver's all-reduce before the
subtraction (and before `rsqrt`) is exactly SyncBatchNorm's: every rank normalises with the
whole batch's statistics, and the model trains as one process does. Under a channel split
everything stays `S(1)` / `S(0)` with no collective. In eval mode nothing is taken over the
batch: x splits on any dim with the [C] tensors replicated, or on C with them split.

The rewrite follows torch's own decomposition (`torch._decomp`): statistics in the
computation dtype (float32 for half inputs), x centred before scaling (the weight's gradient
is a sum of g * (x - mean), without cancellation), output cast back to x's dtype, the saved
statistics as the device returns them. `DECOMPOSITIONS` is merged into
`autopar.rules.DECOMPOSITIONS`, which capture applies. A step with training-mode batch norm
is not run as micro-batches: its statistics are the whole batch's (`split_microbatches` refuses it).
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


def _affine(normalised: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
            dtype: torch.dtype) -> torch.Tensor:
    """`normalised * weight[c] + bias[c]`, cast to `dtype` (the input's)."""
    out = normalised
    if weight is not None:
        out = aten.mul.Tensor(out, _per_channel(weight, out.ndim))
    if bias is not None:
        out = aten.add.Tensor(out, _per_channel(bias, out.ndim))
    return out if out.dtype == dtype else out.to(dtype)


def _batch_statistics(x: torch.Tensor, eps: float):
    """(centred x, mean, biased var, invstd, n): the statistics keep their reduced dims, in
    the computation dtype; means are sums over the global count n (see the module docstring)."""
    reduced = [0, *range(2, x.ndim)]
    n = x.numel() // x.shape[1]
    xc = x.to(get_computation_dtype(x.dtype))
    mean = aten.div.Tensor(aten.sum.dim_IntList(xc, reduced, True), n)
    centred = aten.sub.Tensor(xc, mean)
    var = aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(centred, centred), reduced, True), n)
    invstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
    return centred, mean, var, invstd, n


def _saved(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A statistic as the op returns it: [C], in x's dtype on CPU (torch's convention)."""
    t = aten.view.default(t, [x.shape[1]])
    return t.to(x.dtype) if x.device.type == "cpu" and t.dtype != x.dtype else t


def _blend(running: torch.Tensor, batch: torch.Tensor, momentum: float) -> torch.Tensor:
    """`(1 - momentum) * running + momentum * batch`, in the running statistic's dtype."""
    new = aten.add.Tensor(aten.mul.Tensor(batch, momentum), aten.mul.Tensor(running, 1 - momentum))
    return new if new.dtype == running.dtype else new.to(running.dtype)


def _batch_norm_eval(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                     running_mean: torch.Tensor, running_var: torch.Tensor, momentum: float,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = get_computation_dtype(x.dtype)
    mean = running_mean if running_mean.dtype == dtype else running_mean.to(dtype)
    var = running_var if running_var.dtype == dtype else running_var.to(dtype)
    invstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
    scale = invstd if weight is None else aten.mul.Tensor(invstd, weight)
    out = _affine(aten.mul.Tensor(aten.sub.Tensor(x, _per_channel(mean, x.ndim)),
                                  _per_channel(scale, x.ndim)), None, bias, x.dtype)
    if x.device.type == "cpu":
        return out, x.new_zeros((0,)), x.new_zeros((0,))
    return out, aten.clone.default(mean), invstd


def _batch_norm_train(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                      running_mean: torch.Tensor, running_var: torch.Tensor, training: bool,
                      momentum: float, eps: float):
    if not training:
        out, save_mean, save_invstd = _batch_norm_eval(x, weight, bias, running_mean,
                                                       running_var, momentum, eps)
        return out, save_mean, save_invstd, running_mean, running_var
    centred, mean, var, invstd, n = _batch_statistics(x, eps)
    out = _affine(aten.mul.Tensor(centred, invstd), weight, bias, x.dtype)
    unbiased = aten.mul.Tensor(_saved(var, var), n / max(n - 1, 1))
    return (out, _saved(mean, x), _saved(invstd, x),
            _blend(running_mean, _saved(mean, mean), momentum),
            _blend(running_var, unbiased, momentum))


def _batch_norm_no_stats(x: torch.Tensor, weight: torch.Tensor | None,
                         bias: torch.Tensor | None, training: bool, momentum: float,
                         eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    centred, mean, _, invstd, _ = _batch_statistics(x, eps)
    out = _affine(aten.mul.Tensor(centred, invstd), weight, bias, x.dtype)
    return out, _saved(mean, x), _saved(invstd, x)


DECOMPOSITIONS: dict[object, Callable] = {
    aten._native_batch_norm_legit_no_training.default: _batch_norm_eval,
    aten._native_batch_norm_legit_functional.default: _batch_norm_train,
    aten._native_batch_norm_legit.no_stats: _batch_norm_no_stats,
}
