"""Representative calls of the matmul, pointwise, view, slicing and indexing ops, with real
tensors: sizes divisible by 4 where a split is expected, size-1 and broadcast dims where
none is allowed. `rule_cases_nn` holds the other families."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

aten = torch.ops.aten
_gen = torch.Generator().manual_seed(1234)


def f(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=_gen, dtype=torch.float64)


def pos(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=_gen, dtype=torch.float64) + 0.5


def ints(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=_gen)


def mask(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=_gen) > 0.5


@dataclass(frozen=True)
class Case:
    name: str
    target: Any
    args: tuple
    kwargs: dict = field(default_factory=dict)
    backward: bool = True
    frozen: tuple[int, ...] = ()  # inputs the op has no gradient for


def call(name: str, target: Any, *args: Any, backward: bool = True,
       frozen: tuple[int, ...] = (), **kwargs: Any) -> Case:
    return Case(name, target, args, kwargs, backward, frozen)


MATMUL = [
    call("linear3d_bias", aten.linear.default, f(4, 8, 8), f(12, 8), f(12)),
    call("linear2d", aten.linear.default, f(8, 8), f(4, 8)),
    call("linear1d_bias", aten.linear.default, f(8), f(4, 8), f(4)),
    call("linear_bias_kw", aten.linear.default, f(4, 1, 8), f(4, 8), bias=f(4)),
    call("mm", aten.mm.default, f(8, 4), f(4, 8)),
    call("addmm_vec", aten.addmm.default, f(12), f(4, 8), f(8, 12), beta=0.5, alpha=2.0),
    call("addmm_col", aten.addmm.default, f(4, 1), f(4, 8), f(8, 12)),
    call("bmm", aten.bmm.default, f(4, 8, 4), f(4, 4, 8)),
    call("baddbmm", aten.baddbmm.default, f(4, 8, 8), f(4, 8, 4), f(4, 4, 8)),
    call("baddbmm_bcast", aten.baddbmm.default, f(1, 8, 8), f(4, 8, 4), f(4, 4, 8)),
    call("matmul4d", aten.matmul.default, f(2, 4, 8, 4), f(2, 4, 4, 8)),
    call("matmul_bcast", aten.matmul.default, f(4, 1, 8, 4), f(4, 4, 8)),
    call("matmul3d2d", aten.matmul.default, f(4, 8, 4), f(4, 8)),
    call("matmul1d2d", aten.matmul.default, f(4), f(4, 8)),
    call("matmul2d1d", aten.matmul.default, f(8, 4), f(4)),
    call("matmul1d1d", aten.matmul.default, f(8), f(8)),
    call("dot", aten.dot.default, f(8), f(8)),
]

POINTWISE = [
    call("add_bcast", aten.add.Tensor, f(4, 8), f(8)),
    call("add_outer", aten.add.Tensor, f(4, 1, 8), f(1, 4, 8), alpha=2.0),
    call("add_scalar", aten.add.Tensor, f(4, 8), 1.5),
    call("sub", aten.sub.Tensor, f(4, 8), f(4, 8)),
    call("rsub_scalar", aten.rsub.Scalar, f(4, 8), 1.0),
    call("mul", aten.mul.Tensor, f(4, 8, 4), f(8, 1)),
    call("mul_scalar", aten.mul.Tensor, f(4, 8), 3.0),
    call("mul_inplace", aten.mul_.Tensor, f(4, 8), f(8)),
    call("div", aten.div.Tensor, f(4, 8), pos(4, 8)),
    call("div_scalar", aten.div.Tensor, f(4, 8), 4.0),
    call("div_floor", aten.div.Tensor_mode, f(4, 8), pos(8), rounding_mode="floor"),
    call("neg", aten.neg.default, f(4, 8)),
    call("pow", aten.pow.Tensor_Scalar, f(4, 8), 2),
    call("pow_tt", aten.pow.Tensor_Tensor, pos(4, 8), f(8)),
    call("rsqrt", aten.rsqrt.default, pos(4, 8)),
    call("sqrt", aten.sqrt.default, pos(4, 8)),
    call("exp", aten.exp.default, f(4, 8)),
    call("log", aten.log.default, pos(4, 8)),
    call("tanh", aten.tanh.default, f(4, 8)),
    call("gelu_tanh", aten.gelu.default, f(4, 8), approximate="tanh"),
    call("silu", aten.silu.default, f(4, 8)),
    call("relu", aten.relu.default, f(4, 8)),
    call("sigmoid", aten.sigmoid.default, f(4, 8)),
    call("cos", aten.cos.default, f(8, 4)),
    call("sin", aten.sin.default, f(8, 4)),
    call("where", aten.where.self, mask(4, 8), f(4, 8), f(8)),
    call("where_zero", aten.where.ScalarOther, mask(4, 8), f(4, 8), 0.0),
    call("where_one", aten.where.ScalarOther, mask(4, 8), f(4, 8), 1.0),
    call("nonzero_where", aten.where.default, mask(4, 8), backward=False),
    call("masked_fill_zero", aten.masked_fill.Scalar, f(4, 8, 8), mask(8, 8), 0.0),
    call("masked_fill_inf", aten.masked_fill.Scalar, f(4, 8, 8), mask(8, 8), float("-inf"),
       backward=False),
    call("clone", aten.clone.default, f(4, 8)),
    call("contiguous", aten.contiguous.default, f(4, 8)),
    call("alias", aten.alias.default, f(4, 8)),
    call("detach", aten.detach.default, f(4, 8), backward=False),
    call("to_copy", aten._to_copy.default, f(4, 8), dtype=torch.float32),
    call("to_dtype", aten.to.dtype, f(4, 8), torch.float32),
    call("to_int", aten.to.dtype, f(4, 8), torch.int64),
    call("type_as", aten.type_as.default, f(4, 8), f(2).float()),
    call("dropout_p0", aten.dropout.default, f(4, 8), 0.0, True),
    call("native_dropout_eval", aten.native_dropout.default, f(4, 8), 0.5, False),
    call("triu", aten.triu.default, f(4, 8, 8), 1),
    call("tril", aten.tril.default, f(4, 8, 8)),
    call("eq_scalar", aten.eq.Scalar, ints(3, 4, 8), 1),
    call("gt", aten.gt.Tensor, f(4, 8), f(8)),
    call("maximum", aten.maximum.default, f(4, 8), f(4, 1)),
    call("clamp", aten.clamp.default, f(4, 8), -0.5, 0.5),
    call("broadcast_tensors", aten.broadcast_tensors.default, [f(4, 1, 8), f(4, 8)]),
]

VIEWS = [
    call("view_merge", aten.view.default, f(4, 8, 6), [32, 6]),
    call("view_split_heads", aten.view.default, f(4, 8, 8), [4, 8, 2, 4]),
    call("view_flat_neg", aten.view.default, f(8, 8), [-1]),
    call("view_unflat", aten.view.default, f(64), [4, 16]),
    call("view_ones", aten.view.default, f(4, 8, 1, 8), [4, 1, 8, 8]),
    call("view_mixed", aten.view.default, f(4, 6, 4), [8, 12]),
    call("reshape_neg", aten.reshape.default, f(4, 2, 8, 4), [4, 2, -1]),
    call("unsafe_view", aten._unsafe_view.default, f(4, 8, 4), [32, 4]),
    call("flatten", aten.flatten.using_ints, f(4, 8, 4), 0, 1),
    call("unflatten", aten.unflatten.int, f(4, 32), 1, [4, -1]),
    call("squeeze_dim", aten.squeeze.dim, f(4, 1, 8), 1),
    call("squeeze", aten.squeeze.default, f(4, 1, 8)),
    call("unsqueeze", aten.unsqueeze.default, f(4, 8), 1),
    call("view_as", aten.view_as.default, f(4, 8, 4), f(32, 4)),
    call("expand", aten.expand.default, f(4, 1, 8), [4, 4, 8]),
    call("expand_new", aten.expand.default, f(8), [4, -1]),
    call("expand_as", aten.expand_as.default, f(4, 1, 8), f(4, 4, 8)),
    call("repeat", aten.repeat.default, f(4, 8), [2, 1, 1]),
    call("transpose", aten.transpose.int, f(4, 8, 4), 0, 2),
    call("t", aten.t.default, f(4, 8)),
    call("mT", aten.mT.default, f(2, 4, 8)),
    call("permute", aten.permute.default, f(4, 8, 4), [2, 0, 1]),
    call("movedim", aten.movedim.int, f(4, 8, 4), 0, -1),
    call("swapaxes", aten.swapaxes.default, f(4, 8, 4), 0, 1),
]

SLICING = [
    call("split", aten.split.Tensor, f(4, 8, 12), 4, 2),
    call("split_sizes", aten.split_with_sizes.default, f(4, 8), [2, 6], 1),
    call("chunk", aten.chunk.default, f(4, 8), 2, 1),
    call("unbind", aten.unbind.int, f(4, 2, 8), 1),
    call("slice", aten.slice.Tensor, f(4, 8, 8), 2, 0, 4),
    call("slice_whole", aten.slice.Tensor, f(8, 4), 0, 0, 8),
    call("slice_open", aten.slice.Tensor, f(4, 8), 1, 0, 9223372036854775807),
    call("narrow", aten.narrow.default, f(4, 8), 1, 2, 4),
    call("select", aten.select.int, f(4, 8, 4), 1, 3),
    call("cat", aten.cat.default, [f(4, 8), f(4, 4)], -1),
    call("cat0", aten.cat.default, [f(4, 8), f(8, 8)]),
    call("stack", aten.stack.default, [f(4, 8), f(4, 8)], 1),
    call("repeat_interleave", aten.repeat_interleave.self_int, f(2, 4, 8, 4), 2, 1,
       output_size=8),
    call("pad_last", aten.pad.default, f(4, 8, 6), [0, 2]),
    call("pad_two_dims", aten.pad.default, f(4, 8, 6), [1, 0, 0, 3], "constant", 1.5),
    call("pad_reflect", aten.pad.default, f(4, 8, 6), [2, 2], "reflect"),
    call("constant_pad_nd", aten.constant_pad_nd.default, f(4, 8), [0, 0, 2, 2]),
    call("diff", aten.diff.default, f(4, 8, 6), 1, 1),
    call("diff_prepend", aten.diff.default, f(4, 8), 2, -1, f(4, 2), f(4, 1)),
    call("slice_scatter", aten.slice_scatter.default, f(4, 8, 6), f(4, 3, 6), 1, 2, 5),
    call("slice_scatter_step", aten.slice_scatter.default, f(8, 4), f(4, 4), 0, 0, 8, 2),
    call("slice_scatter_whole", aten.slice_scatter.default, f(4, 8), f(4, 8), 1),
    call("select_scatter", aten.select_scatter.default, f(4, 8, 6), f(4, 6), 1, 2),
]


def rows(high: int, count: int) -> torch.Tensor:
    """`count` distinct indices below `high` (an overwriting scatter is then deterministic)."""
    return torch.randperm(high, generator=_gen)[:count]


_mask = mask(4, 8)

INDEXING = [
    call("index_mid", aten.index.Tensor, f(4, 8, 4), [None, ints(8, 4)]),
    call("index_pair", aten.index.Tensor, f(8, 8, 4), [ints(8, 4, 1), ints(8, 1, 4)]),
    call("index_apart", aten.index.Tensor, f(8, 4, 8), [ints(8, 4), None, ints(8, 4)]),
    call("index_select", aten.index_select.default, f(4, 8), 1, ints(8, 4)),
    call("gather", aten.gather.default, f(4, 8), 1, ints(8, 4, 4)),
    call("scatter_add", aten.scatter_add.default, f(4, 8), 1, ints(8, 4, 4), f(4, 4)),
    call("scatter_add_wide", aten.scatter_add.default, f(4, 8), 0, ints(4, 4, 8), f(4, 8)),
    call("index_add", aten.index_add.default, f(8, 4), 0, ints(8, 4), f(4, 4)),
    call("scatter_src", aten.scatter.src, f(4, 8), 1, ints(8, 4, 4), f(4, 4)),
    call("one_hot", aten.one_hot.default, ints(8, 4, 4), 8),
    call("scatter_reduce_sum", aten.scatter_reduce.two, f(4, 8), 1, ints(8, 4, 4), f(4, 4),
         "sum"),
    call("scatter_reduce_mean", aten.scatter_reduce.two, f(4, 8), 1, ints(8, 4, 4), f(4, 4),
         "mean", include_self=False),
    call("scatter_reduce_amax", aten.scatter_reduce.two, f(4, 8), 0, ints(4, 4, 8), f(4, 8),
         "amax"),
    call("index_put", aten.index_put.default, f(4, 8, 6), [None, rows(8, 4)], f(4, 4, 6)),
    # A static KV cache's update: (batch, kv heads, positions, head dim), 3 new positions.
    call("index_copy", aten.index_copy.default, f(4, 2, 8, 6), 2, rows(8, 3), f(4, 2, 3, 6)),
    call("index_put_bcast", aten.index_put.default, f(4, 8, 6), [None, rows(8, 4)], f(6)),
    call("index_put_acc", aten.index_put.default, f(8, 4), [ints(8, 8)], f(8, 4), True),
    call("index_put_acc_2d", aten.index_put.default, f(8, 4, 6), [ints(8, 4, 4), None],
         f(4, 4, 1, 6), True),
    call("index_put_apart", aten.index_put.default, f(8, 4, 8),
         [rows(8, 4), None, rows(8, 4)], f(4, 4)),
    call("index_put_inplace", aten.index_put_.default, f(4, 8), [None, rows(8, 4)], f(4, 4)),
    call("index_put_mask_fill", aten.index_put.default, f(4, 8, 4), [mask(4, 8, 4)],
         torch.tensor(0.5, dtype=torch.float64)),
    call("index_put_mask_rows", aten.index_put.default, f(4, 8, 4), [_mask], f(4), True),
    call("index_put_mask_values", aten.index_put.default, f(4, 8, 4), [_mask],
         f(int(_mask.sum()), 4)),
    call("index_fill", aten.index_fill.int_Scalar, f(4, 8), 1, ints(8, 3), 0.0),
    call("index_fill_one", aten.index_fill.int_Scalar, f(4, 8), 0, ints(4, 3), 1.0),
    call("index_fill_tensor", aten.index_fill.int_Tensor, f(4, 8), 1, ints(8, 3),
         torch.tensor(1.5, dtype=torch.float64)),
]

CASES: list[Case] = MATMUL + POINTWISE + VIEWS + SLICING + INDEXING
