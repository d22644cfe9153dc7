"""The registry resolves every op of the covered families and of the exported examples, and
nothing else; every rule runs on every node of those graphs."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

from autopar.rules import OpSpec, lookup
from autopar.values.specs import TensorSpec
from examples import gpt, llama

aten = torch.ops.aten

COVERED = [
    aten.linear.default, aten.mm.default, aten.addmm.default, aten.bmm.default,
    aten.matmul.default, aten.baddbmm.default, aten.add.Tensor, aten.sub.Tensor,
    aten.mul.Tensor, aten.div.Tensor, aten.neg.default, aten.pow.Tensor_Scalar,
    aten.rsqrt.default, aten.sqrt.default, aten.exp.default, aten.log.default,
    aten.tanh.default, aten.gelu.default, aten.silu.default, aten.relu.default,
    aten.sigmoid.default, aten.cos.default, aten.sin.default, aten.where.self,
    aten.masked_fill.Scalar, aten.clone.default, aten.contiguous.default,
    aten._to_copy.default, aten.to.dtype, aten.type_as.default, aten.alias.default,
    aten.dropout.default, aten.triu.default, aten.tril.default, aten.view.default,
    aten.reshape.default, aten._unsafe_view.default, aten.flatten.using_ints,
    aten.unflatten.int, aten.unsqueeze.default, aten.squeeze.dim, aten.transpose.int,
    aten.t.default, aten.permute.default, aten.expand.default, aten.split.Tensor,
    aten.split_with_sizes.default, aten.chunk.default, aten.unbind.int, aten.slice.Tensor,
    aten.select.int, aten.narrow.default, aten.cat.default, aten.stack.default,
    aten.repeat_interleave.self_int, aten.index.Tensor, aten.index_select.default,
    aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default,
    aten.amax.default, aten.max.dim, aten.softmax.int, aten._softmax.default,
    aten.log_softmax.int, aten._log_softmax.default, aten.var_mean.correction,
    aten.argmax.default, aten.topk.default, aten.layer_norm.default, aten.rms_norm.default,
    aten.scaled_dot_product_attention.default, aten.embedding.default,
    aten.cross_entropy_loss.default, aten.nll_loss.default, aten.nll_loss_forward.default,
    aten.nll_loss_nd.default, aten.mse_loss.default, aten.arange.default, aten.arange.start,
    aten.ones.default, aten.zeros.default, aten.full.default, aten.empty.memory_format,
    aten.scalar_tensor.default, aten.new_zeros.default, aten.new_ones.default,
    aten.new_full.default, aten.new_empty.default, aten.one_hot.default,
    aten.scatter_add.default, aten.index_add.default, aten.zeros_like.default,
    aten.pad.default, aten.constant_pad_nd.default, aten.diff.default,
    aten.max_pool1d.default, aten.max_pool2d.default, aten.max_pool3d.default,
    aten.max_pool2d_with_indices.default, aten.avg_pool2d.default,
    aten.adaptive_avg_pool2d.default, aten.adaptive_max_pool2d.default,
    aten.upsample_nearest2d.vec, aten.upsample_bilinear2d.vec, aten.upsample_bicubic2d.vec,
    aten.upsample_trilinear3d.vec, aten.upsample_linear1d.vec,
    aten._upsample_nearest_exact2d.vec, aten.conv_transpose1d.default,
    aten.conv_transpose2d.input, aten.conv_transpose3d.input, aten.lstm.input,
    aten.gru.input, aten.rnn_tanh.input, aten.rnn_relu.input, aten.instance_norm.default,
    aten.index_put.default, aten.index_put_.default, aten.slice_scatter.default,
    aten.select_scatter.default, aten.scatter_reduce.two, aten.index_fill.int_Scalar,
    aten.cummax.default, aten.cummin.default,
]


@pytest.mark.parametrize("op", COVERED, ids=str)
def test_covered_ops_resolve(op: object) -> None:
    assert lookup(op) is not None


@pytest.mark.parametrize("target", [
    aten.fft_fft.default, aten.cholesky.default, aten.view.dtype, operator.getitem, "add",
    print,
], ids=str)
def test_unknown_targets_have_no_rule(target: object) -> None:
    assert lookup(target) is None


def test_exact_overload_wins_over_packet() -> None:
    assert lookup(aten.where.default) is not lookup(aten.where.self)
    assert lookup(aten.max.other) is not lookup(aten.max.dim)
    assert lookup(aten.add.Scalar) is lookup(aten.add.Tensor)  # through the packet


class _Llama(nn.Module):
    """One block with the GQA spellings the examples do not use, and a tied head."""

    def __init__(self, gqa: str, vocab: int = 32, hidden: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.gqa, self.heads = gqa, heads
        self.emb = nn.Embedding(vocab, hidden)
        self.norm = nn.RMSNorm(hidden)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.kv = nn.Linear(hidden, hidden, bias=False)  # 2 kv heads, k and v fused
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        b, s = idx.shape
        x = self.norm(self.emb(idx))
        q = self.q(x).view(b, s, self.heads, -1).transpose(1, 2)
        k, v = (t.view(b, s, 2, -1).transpose(1, 2) for t in self.kv(x).chunk(2, -1))
        if self.gqa == "repeat":
            k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.gqa == "native")
        x = x + y.transpose(1, 2).reshape(b, s, -1)
        return F.cross_entropy(self.head(x).view(-1, self.head.out_features), targets.view(-1))


class _MoE(nn.Module):
    """Top-2 router over 4 dense experts, combined with one-hot gates."""

    def __init__(self, hidden: int = 16, experts: int = 4) -> None:
        super().__init__()
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.view(-1, x.shape[-1])
        weights, chosen = torch.topk(F.softmax(self.router(flat), dim=-1), 2, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        gates = (F.one_hot(chosen, len(self.experts)).float() * weights[..., None]).sum(1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            out = out + gates[:, e:e + 1] * F.silu(expert(flat))
        return F.mse_loss(out.view_as(x), x)


def _models() -> list:
    tokens = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
    models = [
        ("gpt", *gpt.build(vocab=32, seq=8, hidden=16, heads=2, layers=1)),
        ("llama", *llama.build(vocab=32, seq=8, hidden=16, heads=4, kv_heads=2, ffn=32,
                               layers=1)),
        ("gqa_repeat", _Llama("repeat"), tokens),
        ("gqa_native", _Llama("native"), tokens),
        ("moe", _MoE(), (torch.randn(2, 8, 16),)),
    ]
    return [pytest.param(*m, id=m[0]) for m in models]


def _spec(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return TensorSpec(tuple(value.shape), value.dtype)
    if isinstance(value, (tuple, list)) and value and all(
            isinstance(v, torch.Tensor) for v in value):
        return tuple(_spec(v) for v in value)
    return None


def _op_spec(node: torch.fx.Node) -> OpSpec:
    def convert(value: object) -> object:
        return _spec(value.meta.get("val")) if isinstance(value, torch.fx.Node) else value

    leaves = pytree.tree_leaves((node.args, node.kwargs))
    tensors = [n.meta["val"] for n in leaves if isinstance(n, torch.fx.Node)
               and isinstance(n.meta.get("val"), torch.Tensor)]
    out = _spec(node.meta.get("val"))
    outputs = out if isinstance(out, tuple) else (out,) if out is not None else ()
    return OpSpec(node.target, pytree.tree_map(convert, tuple(node.args)),
                  pytree.tree_map(convert, dict(node.kwargs)),
                  tuple(_spec(t) for t in tensors), outputs)


@pytest.mark.parametrize("name,model,inputs", _models())
def test_exported_graph_is_covered(name: str, model: nn.Module, inputs: tuple) -> None:
    graph = torch.export.export(model, inputs, strict=False).graph
    missing = set()
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        rule = lookup(node.target)
        if rule is None:
            missing.add(str(node.target))
            continue
        if _spec(node.meta.get("val")) is None:
            continue  # no tensor output: not a sharding decision
        for strategy in rule(_op_spec(node)):
            assert len(strategy.inputs) == len(_op_spec(node).inputs), node.format_node()
    assert not missing, f"{name}: no rule for {sorted(missing)}"
