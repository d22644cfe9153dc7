"""Representative calls of the embedding, reduction, norm, attention, loss and factory ops
(see `rule_cases`)."""

from __future__ import annotations

import torch
from rule_cases import Case, call, f, ints, mask, pos

aten = torch.ops.aten
_gen = torch.Generator().manual_seed(4321)

_padded = torch.cat([ints(16, 4, 6), torch.full((4, 2), 3)], 1)
EMBEDDING = [
    call("embedding", aten.embedding.default, f(16, 8), ints(16, 4, 8)),
    call("embedding_pad", aten.embedding.default, f(16, 8), _padded, 3),
    call("embedding_freq", aten.embedding.default, f(16, 8), ints(16, 8), -1, True),
]

REDUCTIONS = [
    call("sum", aten.sum.default, f(4, 8)),
    call("sum_dim", aten.sum.dim_IntList, f(4, 8, 4), [1]),
    call("sum_keep", aten.sum.dim_IntList, f(4, 8, 4), [0, 2], True),
    call("sum_all", aten.sum.dim_IntList, f(4, 8), []),
    call("sum_bool", aten.sum.dim_IntList, mask(4, 8), [1]),
    call("mean", aten.mean.default, f(4, 8)),
    call("mean_dim", aten.mean.dim, f(4, 8, 4), [-1], True),
    call("amax", aten.amax.default, f(4, 8), [1]),
    call("max_dim", aten.max.dim, f(4, 8), 1),
    call("argmax", aten.argmax.default, f(4, 8), -1),
    call("argmax_flat", aten.argmax.default, f(4, 8)),
    call("var_mean", aten.var_mean.correction, f(4, 8, 4), [2], correction=1, keepdim=True),
    call("var", aten.var.correction, f(4, 8), [1]),
    call("std", aten.std.dim, f(4, 8), [1]),
    call("vector_norm", aten.linalg_vector_norm.default, f(4, 8), 2, [-1]),
    call("softmax", aten.softmax.int, f(4, 8), -1),
    call("_softmax", aten._softmax.default, f(4, 8, 4), 1, False),
    call("log_softmax", aten.log_softmax.int, f(4, 8), 1),
    call("_log_softmax", aten._log_softmax.default, f(4, 8), 0, False),
    call("cumsum", aten.cumsum.default, f(4, 8), 1),
    call("cumprod", aten.cumprod.default, f(4, 8, 4), 2),
    call("cummax", aten.cummax.default, f(4, 8), 0),
    call("cummin", aten.cummin.default, f(4, 8, 4), -1),
    call("topk", aten.topk.default, f(4, 8), 2),
    call("sort", aten.sort.default, f(4, 8), 0),
    call("argsort", aten.argsort.default, f(4, 8)),
    call("logsumexp", aten.logsumexp.default, f(4, 8), [1]),
    call("any", aten.any.dim, mask(4, 8), 0),
    call("count_nonzero", aten.count_nonzero.dim_IntList, f(4, 8), [0]),
]

NORMS = [
    call("layer_norm", aten.layer_norm.default, f(4, 8, 8), [8], f(8), f(8), 1e-5),
    call("layer_norm_2d", aten.layer_norm.default, f(4, 4, 8), [4, 8]),
    call("native_layer_norm", aten.native_layer_norm.default, f(4, 8), [8], f(8), None, 1e-5),
    call("rms_norm", aten.rms_norm.default, f(4, 8, 8), [8], f(8)),
    call("rms_norm_eps", aten.rms_norm.default, f(4, 8, 8), [8], f(8), 1e-6),
]

ATTENTION = [
    call("sdpa_causal", aten.scaled_dot_product_attention.default,
       f(4, 4, 8, 8), f(4, 4, 8, 8), f(4, 4, 8, 8), None, 0.0, True),
    call("sdpa", aten.scaled_dot_product_attention.default, f(4, 4, 8, 8), f(4, 4, 8, 8),
       f(4, 4, 8, 4)),
    call("sdpa_bool_mask", aten.scaled_dot_product_attention.default, f(4, 4, 8, 8),
       f(4, 4, 8, 8), f(4, 4, 8, 8), attn_mask=torch.tril(torch.ones(8, 8)).bool()),
    call("sdpa_float_mask", aten.scaled_dot_product_attention.default, f(4, 4, 8, 8),
       f(4, 4, 4, 8), f(4, 4, 4, 8), f(4, 1, 8, 4)),
    call("sdpa_gqa", aten.scaled_dot_product_attention.default, f(2, 8, 8, 4), f(2, 4, 8, 4),
       f(2, 4, 8, 4), is_causal=True, enable_gqa=True),
    call("sdpa_mqa", aten.scaled_dot_product_attention.default, f(2, 4, 8, 4), f(2, 1, 8, 4),
       f(2, 1, 8, 4), enable_gqa=True, scale=0.3),
    call("sdpa_3d", aten.scaled_dot_product_attention.default, f(4, 8, 8), f(4, 8, 8),
       f(4, 8, 8)),
]

_targets = ints(16, 8)
_targets[::3] = -1
LOSSES = [
    call("ce_mean", aten.cross_entropy_loss.default, f(8, 16), ints(16, 8)),
    call("ce_none", aten.cross_entropy_loss.default, f(8, 16), ints(16, 8), None, 0),
    call("ce_sum_ignore", aten.cross_entropy_loss.default, f(8, 16), _targets, f(16).abs(), 2,
       -1, 0.1, frozen=(2,)),
    call("ce_probs", aten.cross_entropy_loss.default, f(8, 16), f(8, 16).softmax(-1),
       reduction=2),
    call("ce_spatial", aten.cross_entropy_loss.default, f(4, 16, 8), ints(16, 4, 8), None, 0),
    call("nll_nd", aten.nll_loss_nd.default, f(8, 16), _targets, None, 1, -1),
    call("nll_sum", aten.nll_loss.default, f(8, 16), ints(16, 8), f(16).abs(), 2, frozen=(2,)),
    call("nll_forward", aten.nll_loss_forward.default, f(8, 16), _targets, None, 2, -1),
    call("nll2d", aten.nll_loss2d.default, f(4, 8, 4, 4), ints(8, 4, 4, 4), None, 0),
    call("mse_mean", aten.mse_loss.default, f(4, 8), f(4, 8)),
    call("mse_sum", aten.mse_loss.default, f(4, 8), f(4, 8), 2),
    call("mse_none", aten.mse_loss.default, f(4, 8), f(4, 8), 0),
    call("l1_sum", aten.l1_loss.default, f(4, 8), f(4, 8), 2),
    call("smooth_l1", aten.smooth_l1_loss.default, f(4, 8), f(4, 8), 0, 0.5),
    call("huber", aten.huber_loss.default, f(4, 8), f(4, 8), 2, 0.5),
    call("bce_logits", aten.binary_cross_entropy_with_logits.default, f(4, 8),
       torch.rand(4, 8, generator=_gen, dtype=torch.float64), None, pos(8), 2, frozen=(2,)),
]

FACTORIES = [
    call("arange", aten.arange.start, 0, 8, backward=False),
    call("zeros", aten.zeros.default, [4, 8], backward=False),
    call("zeros_like", aten.zeros_like.default, f(4, 8), backward=False),
    call("ones_like", aten.ones_like.default, f(4, 8), backward=False),
    call("full_like", aten.full_like.default, f(4, 8), 2.0, backward=False),
    call("new_zeros", aten.new_zeros.default, f(4, 8), [3], backward=False),
]

CASES: list[Case] = EMBEDDING + REDUCTIONS + NORMS + ATTENTION + LOSSES + FACTORIES
