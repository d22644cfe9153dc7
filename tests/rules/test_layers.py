"""The pooling, interpolation, transposed-convolution, recurrent, instance-norm, eval-mode
batch-norm and scatter ops beyond the checks every rule gets (`test_rule_strategies` runs
the cases of `rule_cases_layers` and the others on 2 and 4 simulated ranks, forward and
backward): the op names nn layers export to have rules, the splits offered are the intended
ones, the rewrites capture applies are exact and leave ops the strategy pass can split, and
the FLOPs of the new ops are counted."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from rule_cases import Case, f, pos
from rule_cases_layers import CASES, _weights
from simulate import build
from torch import nn

import autopar
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.passes.strategies.find_strategies import find_strategies
from autopar.rules import DECOMPOSITIONS, AxisStrategy, lookup
from autopar.rules.common import P, R, S, draws
from autopar.values.placement import Partial, Replicate, Shard
from autopar.values.specs import FLOPS

aten = torch.ops.aten


class _Call(nn.Module):
    """A module running `fn(self, *inputs)`, holding `layers`."""

    def __init__(self, fn, *layers: nn.Module) -> None:
        super().__init__()
        self.fn, self.layers = fn, nn.ModuleList(layers)

    def forward(self, *inputs):
        return self.fn(self, *inputs)


def _layer(layer: nn.Module, train: bool = True) -> nn.Module:
    return layer.train(train)


def _setitem(fn):
    """A module writing into a copy of its first input with `fn(copy, *rest)`."""

    def run(_, x, *rest):
        y = x.clone()
        fn(y, *rest)
        return y

    return _Call(run)


def _idx(*values: int) -> torch.Tensor:
    return torch.tensor(values)


x1, x2, x3 = torch.randn(2, 4, 8), torch.randn(2, 4, 8, 8), torch.randn(2, 4, 4, 4, 4)
seq, batch_major = torch.randn(6, 4, 5), torch.randn(4, 6, 5)

# (name, module, inputs, op names its captured graph must contain)
EXPORTS = [
    ("max_pool1d", nn.MaxPool1d(2), (x1,), ["aten.max_pool1d.default"]),
    ("max_pool2d", nn.MaxPool2d(3, 2, 1), (x2,), ["aten.max_pool2d.default"]),
    ("max_pool2d_unbatched", nn.MaxPool2d(2), (x2[0],), ["aten.max_pool2d.default"]),
    ("max_pool3d", nn.MaxPool3d(2), (x3,), ["aten.max_pool3d.default"]),
    ("max_pool1d_indices", nn.MaxPool1d(2, return_indices=True), (x1,),
     ["aten.max_pool1d_with_indices.default"]),
    ("max_pool2d_indices", nn.MaxPool2d(2, return_indices=True), (x2,),
     ["aten.max_pool2d_with_indices.default"]),
    ("max_pool3d_indices", nn.MaxPool3d(2, return_indices=True), (x3,),
     ["aten.max_pool3d_with_indices.default"]),
    ("avg_pool1d", nn.AvgPool1d(3, 2, 1), (x1,), ["aten.avg_pool1d.default"]),
    ("avg_pool2d", nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), (x2,),
     ["aten.avg_pool2d.default"]),
    ("avg_pool3d", nn.AvgPool3d(2), (x3,), ["aten.avg_pool3d.default"]),
    ("lp_pool2d", nn.LPPool2d(2, 2), (x2,), ["aten.avg_pool2d.default"]),
    ("adaptive_avg_pool1d", nn.AdaptiveAvgPool1d(3), (x1,),
     ["aten.adaptive_avg_pool1d.default"]),
    ("adaptive_avg_pool2d", nn.AdaptiveAvgPool2d(1), (x2,),
     ["aten.adaptive_avg_pool2d.default"]),
    ("adaptive_avg_pool3d", nn.AdaptiveAvgPool3d(3), (x3,),
     ["aten.adaptive_avg_pool3d.default"]),
    ("adaptive_max_pool1d", nn.AdaptiveMaxPool1d(3), (x1,),
     ["aten.adaptive_max_pool1d.default"]),
    ("adaptive_max_pool2d", nn.AdaptiveMaxPool2d(3, return_indices=True), (x2,),
     ["aten.adaptive_max_pool2d.default"]),
    ("adaptive_max_pool3d", nn.AdaptiveMaxPool3d(2), (x3,),
     ["aten.adaptive_max_pool3d.default"]),
    ("upsample_nearest1d", nn.Upsample(scale_factor=2), (x1,),
     ["aten.upsample_nearest1d.vec"]),
    ("upsample_nearest2d", nn.Upsample(size=(5, 7)), (x2,), ["aten.upsample_nearest2d.vec"]),
    ("upsample_nearest3d", nn.Upsample(scale_factor=2), (x3,),
     ["aten.upsample_nearest3d.vec"]),
    ("upsample_nearest_exact", nn.Upsample(scale_factor=1.5, mode="nearest-exact"), (x2,),
     ["aten._upsample_nearest_exact2d.vec"]),
    ("upsample_linear1d", nn.Upsample(scale_factor=2, mode="linear"), (x1,),
     ["aten.upsample_linear1d.vec"]),
    ("upsample_bilinear2d", nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True),
     (x2,), ["aten.upsample_bilinear2d.vec"]),
    ("upsample_bicubic2d", nn.Upsample(size=12, mode="bicubic"), (x2,),
     ["aten.upsample_bicubic2d.vec"]),
    ("upsample_trilinear3d", nn.Upsample(scale_factor=2, mode="trilinear"), (x3,),
     ["aten.upsample_trilinear3d.vec"]),
    ("interpolate_antialias", _Call(lambda _, x: F.interpolate(
        x, size=(4, 4), mode="bilinear", antialias=True)), (x2,),
     ["aten._upsample_bilinear2d_aa.vec"]),
    ("interpolate_area", _Call(lambda _, x: F.interpolate(x, size=(3, 3), mode="area")),
     (x2,), ["aten.adaptive_avg_pool2d.default"]),
    ("conv_transpose1d", nn.ConvTranspose1d(4, 6, 3, stride=2), (x1,),
     ["aten.conv_transpose1d.default"]),
    ("conv_transpose2d", nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1),
     (x2,), ["aten.conv_transpose2d.input"]),
    ("conv_transpose2d_output_size", _Call(lambda m, x: m.layers[0](x, output_size=[16, 16]),
                                           nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1)),
     (x2,), ["aten.conv_transpose2d.input"]),
    ("conv_transpose3d", nn.ConvTranspose3d(4, 2, 2, stride=2, groups=2), (x3,),
     ["aten.conv_transpose3d.input"]),
    ("instance_norm", nn.InstanceNorm2d(4, affine=True), (x2,), ["aten.instance_norm.default"]),
    # Eval-mode batch norm is rewritten as a per-channel affine map (batch_norm).
    ("batch_norm1d_eval", _layer(nn.BatchNorm1d(4), train=False), (x1,),
     ["aten.sub.Tensor", "aten.mul.Tensor", "aten.add.Tensor"]),
    ("batch_norm2d_eval", _layer(nn.BatchNorm2d(4), train=False), (x2,), ["aten.sub.Tensor"]),
    ("batch_norm3d_eval_plain", _layer(nn.BatchNorm3d(4, affine=False), train=False), (x3,),
     ["aten.rsqrt.default"]),
    ("lstm", _Call(lambda m, x: m.layers[0](x)[0], nn.LSTM(5, 8)), (seq,),
     ["aten.lstm.input"]),
    ("lstm_state", _Call(lambda m, x, h, c: m.layers[0](x, (h, c))[1][1],
                         nn.LSTM(5, 8, 2, bidirectional=True)),
     (seq, torch.randn(4, 4, 8), torch.randn(4, 4, 8)), ["aten.lstm.input"]),
    ("lstm_batch_first", _Call(lambda m, x: m.layers[0](x)[0],
                               nn.LSTM(5, 8, 2, batch_first=True)), (batch_major,),
     ["aten.lstm.input", "aten.transpose.int"]),
    ("gru", _Call(lambda m, x: m.layers[0](x)[1], nn.GRU(5, 8, bidirectional=True)), (seq,),
     ["aten.gru.input"]),
    ("gru_batch_first", _Call(lambda m, x: m.layers[0](x)[0],
                              nn.GRU(5, 8, 2, batch_first=True, dropout=0.1)), (batch_major,),
     ["aten.gru.input"]),
    ("rnn_tanh", _Call(lambda m, x: m.layers[0](x)[0], nn.RNN(5, 8)), (seq,),
     ["aten.rnn_tanh.input"]),
    ("rnn_relu", _Call(lambda m, x: m.layers[0](x)[0], nn.RNN(5, 8, nonlinearity="relu",
                                                              batch_first=True)),
     (batch_major,), ["aten.rnn_relu.input"]),
    ("setitem_index", _setitem(lambda y, i, v: y.__setitem__((slice(None), i), v)),
     (x1, _idx(1, 3), torch.randn(2, 2, 8)), ["aten.index_put.default"]),
    ("setitem_mask", _setitem(lambda y: y.__setitem__(y > 0, 0.0)), (x1,),
     ["aten.index_put.default"]),
    ("setitem_add", _Call(lambda _, x, i, v: x.index_put((i,), v, accumulate=True)),
     (x1, _idx(0, 0), torch.randn(2, 4, 8)), ["aten.index_put.default"]),
    ("setitem_slice", _setitem(lambda y, v: y.__setitem__((slice(None), slice(1, 3)), v)),
     (x1, torch.randn(2, 2, 8)), ["aten.slice_scatter.default"]),
    ("setitem_select", _setitem(lambda y, v: y.__setitem__((slice(None), 2), v)),
     (x1, torch.randn(2, 8)), ["aten.select_scatter.default"]),
    ("scatter_reduce", _Call(lambda _, x, i, v: x.scatter_reduce(2, i, v, "amax")),
     (x1, torch.randint(0, 8, (2, 4, 3)), torch.randn(2, 4, 3)), ["aten.scatter_reduce.two"]),
    ("index_fill", _Call(lambda _, x, i: x.index_fill(2, i, -1.0)), (x1, _idx(0, 5)),
     ["aten.index_fill.int_Scalar"]),
    ("scans", _Call(lambda _, x: x.cummax(1)[0] + x.cummin(2)[0] + x.cumprod(1)), (x1,),
     ["aten.cummax.default", "aten.cummin.default", "aten.cumprod.default"]),
]


def _ops(model: nn.Module, inputs: tuple) -> list:
    gm = capture(model, inputs)
    return [n.target for n in gm.graph.nodes if n.op == "call_function"
            and isinstance(n.target, torch._ops.OpOverload)]


@pytest.mark.parametrize("name,model,inputs,expected", EXPORTS, ids=[e[0] for e in EXPORTS])
def test_exported_ops_have_rules(name: str, model: nn.Module, inputs: tuple,
                                 expected: list[str]) -> None:
    ops = _ops(model, inputs)
    assert set(expected) <= set(map(str, ops)), sorted(map(str, ops))
    missing = sorted({str(op) for op in ops if lookup(op) is None})
    assert not missing, missing


def _offered(name: str) -> list[AxisStrategy]:
    case: Case = next(c for c in CASES if c.name == name)
    op, _ = build(case.target, case.args, case.kwargs)
    return lookup(case.target)(op)


def test_pooling_splits_batch_and_channels_never_space() -> None:
    assert _offered("max_pool2d") == [AxisStrategy((S(0),), S(0)), AxisStrategy((S(1),), S(1))]
    assert _offered("max_pool2d_unbatched") == [AxisStrategy((S(0),), S(0))]  # channels
    # Averages are linear; maxima are not.
    assert AxisStrategy((P,), P) in _offered("avg_pool2d")
    assert AxisStrategy((P,), P) in _offered("adaptive_avg_pool3d")
    assert AxisStrategy((P,), P) not in _offered("adaptive_max_pool2d")
    for name in ("avg_pool3d", "max_pool3d_indices", "adaptive_max_pool1d"):
        assert {s.output for s in _offered(name)} <= {S(0), S(1), P}


def test_interpolation_splits_batch_and_channels_and_is_linear() -> None:
    for name in ("nearest2d_size", "bilinear2d_corners", "bicubic2d", "trilinear3d"):
        assert _offered(name) == [AxisStrategy((S(0),), S(0)), AxisStrategy((S(1),), S(1)),
                                  AxisStrategy((P,), P)]


def test_conv_transpose_weight_is_in_out() -> None:
    op, _ = build(aten.conv_transpose2d.input, (f(4, 8, 5, 5), f(8, 4, 3, 3), f(4)), {})
    assert lookup(aten.conv_transpose2d.input)(op) == [
        AxisStrategy((S(0), R, R), S(0)),     # batch
        AxisStrategy((R, S(1), S(0)), S(1)),  # output channels: W's dim 1
        AxisStrategy((S(1), S(0), P), P),     # input channels: W's dim 0, a summand
        AxisStrategy((P, R, P), P),
    ]


def test_recurrent_layers_split_the_batch_sequence_first_only() -> None:
    # input S(1), h0 and c0 S(1), every weight R -> output, h_n, c_n all S(1).
    assert _offered("lstm") == [AxisStrategy((S(1), S(1), S(1), R, R, R, R), S(1))]
    assert _offered("gru_2layers_no_bias") == [AxisStrategy((S(1), S(1), R, R, R, R), S(1))]
    # batch_first: the output's batch is dim 0, h_n's dim 1; one placement fits neither.
    assert _offered("lstm_batch_first") == []
    # Dropout between layers in training: each rank would draw a mask of its own.
    assert _offered("lstm_train_dropout") == []


@pytest.mark.parametrize("layers,dropout", [(1, 0.5), (2, 0.0)])
def test_recurrent_layers_in_training_split_when_the_lowering_sees_no_draw(layers, dropout):
    """No mask is drawn with one layer or a zero probability; the split is offered once the
    lowering's `common.draws` (asked before it runs a split random op) agrees."""
    args = (f(3, 4, 3), f(layers, 4, 4), _weights(3, 3, 4, layers=layers), True, layers,
            dropout, True, False, False)
    op, _ = build(aten.gru.input, args, {})
    expected = [] if draws(aten.gru.input, args, {}) else [
        AxisStrategy((S(1), S(1), *[R] * (4 * layers)), S(1))]
    assert lookup(aten.gru.input)(op) == expected


@pytest.mark.parametrize("op", [aten.lstm.input, aten.gru.input, aten.rnn_tanh.input])
def test_batch_first_rewrite_is_exact(op) -> None:
    gates = {aten.lstm.input: 4, aten.gru.input: 3}.get(op, 1)
    x = f(4, 3, 5)
    hidden = [f(2, 4, 6), f(2, 4, 6)] if op is aten.lstm.input else f(2, 4, 6)
    params = [f(gates * 6, 5), f(gates * 6, 6), f(gates * 6), f(gates * 6),
              f(gates * 6, 6), f(gates * 6, 6), f(gates * 6), f(gates * 6)]
    leaves = [x, *(hidden if isinstance(hidden, list) else [hidden]), *params]

    def run(fn):
        copies = [t.clone().requires_grad_() for t in leaves]
        x_, rest = copies[0], copies[1:]
        hx = rest[:2] if op is aten.lstm.input else rest[0]
        ps = rest[2:] if op is aten.lstm.input else rest[1:]
        outputs = fn(x_, hx, ps, True, 2, 0.0, True, False, True)
        loss = sum((o * torch.arange(o.numel()).view(o.shape)).sum() for o in outputs)
        return outputs, torch.autograd.grad(loss, copies)

    want, want_grads = run(op)
    got, got_grads = run(DECOMPOSITIONS[op])
    for a, b in zip((*got, *got_grads), (*want, *want_grads)):
        torch.testing.assert_close(a, b)
    assert DECOMPOSITIONS[op](x, hidden, params, True, 2, 0.0, True, False, False) \
        is NotImplemented


_BN = aten._native_batch_norm_legit_no_training.default


@pytest.mark.parametrize("shape,affine", [((4, 6), True), ((4, 6, 5), True),
                                          ((2, 6, 3, 3), False), ((2, 6, 2, 2, 2), True)])
def test_eval_batch_norm_rewrite_is_exact(shape, affine) -> None:
    args = [f(*shape), f(6) if affine else None, f(6) if affine else None, f(6), pos(6)]

    def run(fn):
        # Gradients for input, weight and bias; the running statistics are buffers.
        leaves = [None if a is None else a.clone().requires_grad_(i < 3)
                  for i, a in enumerate(args)]
        out = fn(*leaves, 0.1, 1e-5)
        grads = torch.autograd.grad((out[0] * torch.arange(out[0].numel()).view(
            out[0].shape)).sum(), [t for t in leaves[:3] if t is not None])
        return out, grads

    (want, *extra), want_grads = run(_BN)
    (got, *got_extra), got_grads = run(DECOMPOSITIONS[_BN])
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)
    assert [t.shape for t in got_extra] == [t.shape for t in extra]


def test_eval_batch_norm_rewrite_keeps_the_input_dtype() -> None:
    x = torch.randn(2, 4, 3, 3, dtype=torch.bfloat16)
    stats = [torch.randn(4), torch.randn(4), torch.randn(4), torch.rand(4) + 0.5]
    want = _BN(x, *stats, 0.1, 1e-5)[0]
    got = DECOMPOSITIONS[_BN](x, *stats, 0.1, 1e-5)[0]
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


_BN_TRAIN = aten._native_batch_norm_legit_functional.default
_BN_NO_STATS = aten._native_batch_norm_legit.no_stats


@pytest.mark.parametrize("shape,affine", [((4, 6), True), ((4, 6, 5), True),
                                          ((2, 6, 3, 3), False), ((2, 6, 2, 2, 2), True)])
@pytest.mark.parametrize("op", [_BN_TRAIN, _BN_NO_STATS])
def test_training_batch_norm_rewrite_is_exact(op, shape, affine) -> None:
    """Output, saved statistics, new running statistics and every gradient match the op."""
    x = f(*shape) * 3 + 1
    weight, bias = (f(6), f(6)) if affine else (None, None)
    stats = (f(6), pos(6)) if op is _BN_TRAIN else ()

    def run(fn):
        leaves = [None if a is None else a.clone().requires_grad_() for a in (x, weight, bias)]
        out = fn(*leaves, *stats, True, 0.3, 1e-5)
        probe = torch.arange(out[0].numel(), dtype=x.dtype).view(out[0].shape)
        grads = torch.autograd.grad((out[0] * probe).sum(), [t for t in leaves if t is not None])
        return out, grads

    want, want_grads = run(op)
    got, got_grads = run(DECOMPOSITIONS[op])
    assert len(got) == len(want)
    for a, b in zip((*got, *got_grads), (*want, *want_grads)):
        torch.testing.assert_close(a, b)


def test_training_batch_norm_statistics_are_summands_of_a_batch_split() -> None:
    """Captured in training mode, batch norm is sums over the batch (P when the batch is
    split, all-reduced as SyncBatchNorm does) and pointwise maps; nothing replicates x."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    gm = annotate(capture(model, (torch.randn(4, 3, 6, 6),)))
    ops = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any("batch_norm" in op for op in ops), ops
    table = find_strategies(gm, autopar.Mesh((2,), ("x",), hardware="cpu"))
    assert not table.unsupported, table.unsupported
    sums = [n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList]
    assert len(sums) == 2  # mean and variance
    for node in sums:
        by_input = {s.inputs[0]: s.output for s in table.strategies[node.name]}
        assert by_input[(Shard(0),)] == (Partial(),)   # batch split: a summand
        assert by_input[(Shard(1),)] == (Shard(1),)    # channel split: no collective


_BAG = aten.embedding_bag.padding_idx


@pytest.mark.parametrize("mode,weighted", [(0, False), (0, True), (1, False), (2, False)],
                         ids=["sum", "weighted_sum", "mean", "max"])  # weights: sums only
@pytest.mark.parametrize("padding_idx", [None, 0, 3])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_rewrite_is_exact(mode, weighted, padding_idx,
                                        include_last_offset) -> None:
    """All four outputs and the gradients of the table and the per-sample weights match the
    kernel, with an empty bag, padding entries and a bag of repeated indices."""
    weight, indices = f(10, 3), torch.tensor([1, 2, 0, 4, 5, 0, 3, 3, 7])
    offsets = torch.tensor([0, 2, 2, 4, 9] if include_last_offset else [0, 2, 2, 4, 8])
    sample_weights = pos(9) if weighted else None

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (weight, sample_weights) if t is not None]
        out = fn(leaves[0], indices, offsets, False, mode, False,
                 leaves[1] if weighted else None, include_last_offset, padding_idx)
        probe = torch.arange(out[0].numel(), dtype=weight.dtype).view(out[0].shape)
        return out, torch.autograd.grad((out[0] * probe).sum(), leaves)

    want, want_grads = run(_BAG)
    got, got_grads = run(DECOMPOSITIONS[_BAG])
    for a, b in zip((*got, *got_grads), (*want, *want_grads)):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_splits_the_table(mode) -> None:
    """Captured, a bag's table splits by columns (every mode) and by vocabulary into
    summands (sum and mean), as an embedding does."""
    bag = nn.EmbeddingBag(16, 8, mode=mode)
    model = _Call(lambda m, i, o: m.layers[0](i, o).square().sum(), bag)
    gm = annotate(capture(model, (torch.randint(0, 16, (12,)), torch.tensor([0, 3, 3, 7]))))
    table = find_strategies(gm, autopar.Mesh((2,), ("x",), hardware="cpu"))
    assert not table.unsupported, table.unsupported
    lookup_node = next(n for n in gm.graph.nodes if n.target is aten.embedding.default)
    offered = {s.inputs[0]: s.output for s in table.strategies[lookup_node.name]}
    assert offered[(Shard(1),)] == (Shard(1),)
    reduced = next(n for n in gm.graph.nodes if n.target in (aten.index_add.default,
                                                             aten.scatter_reduce.two)
                   and n.meta["val"].ndim == 2)
    outputs = {s.output for s in table.strategies[reduced.name]}
    assert (Shard(1),) in outputs
    assert ((Partial(),) in outputs) == (mode != "max")


class _FrozenBackbone(nn.Module):
    """Conv, eval-mode BatchNorm, pooling, upsampling, a transposed conv; and a batch_first
    LSTM (eval mode) over the pooled features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8).eval()
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        # Eval mode: in training an RNN is a random op to the lowering (see `recurrent`).
        self.lstm = nn.LSTM(4, 8, batch_first=True).eval()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.norm(self.conv(images))), 2)
        x = self.up(F.interpolate(x, scale_factor=2.0, mode="bilinear"))
        pooled = F.adaptive_avg_pool2d(x, (2, 4)).flatten(2).transpose(1, 2)  # [N, 8, 4]
        return self.lstm(pooled)[0].sum()


def test_strategy_pass_splits_eval_batch_norm_and_batch_first_lstm() -> None:
    gm = annotate(capture(_FrozenBackbone(), (torch.randn(4, 4, 8, 8),)))
    table = find_strategies(gm, autopar.Mesh((2,), ("x",), hardware="cpu"))
    assert not table.unsupported, table.unsupported
    outputs = {node.target: {s.output for s in table.strategies[node.name]}
               for node in gm.graph.nodes if node.name in table.strategies}
    # The normalisation's affine map: by batch and by channel.
    assert {(Shard(0),), (Shard(1),)} <= outputs[aten.sub.Tensor]
    for target in (aten.max_pool2d.default, aten.upsample_bilinear2d.vec,
                   aten.conv_transpose2d.input, aten.adaptive_avg_pool2d.default):
        assert {(Shard(0),), (Shard(1),)} <= outputs[target], target
    assert outputs[aten.lstm.input] == {(Replicate(),), (Shard(1),)}


def _flops(model: nn.Module, *inputs: torch.Tensor) -> dict[str, int]:
    gm = annotate(capture(model, inputs))
    return {str(n.target): n.meta[FLOPS] for n in gm.graph.nodes if n.op == "call_function"}


def test_pooling_and_interpolation_flops() -> None:
    x = torch.randn(2, 4, 8, 8)
    # A window per output element.
    assert _flops(nn.MaxPool2d(3, 1, 1), x)["aten.max_pool2d.default"] == 2 * 4 * 64 * 9
    assert _flops(nn.MaxPool2d(2, return_indices=True), x)[
        "aten.max_pool2d_with_indices.default"] == 2 * 4 * 16 * 4
    assert _flops(nn.AvgPool1d(3), torch.randn(2, 4, 9))["aten.avg_pool1d.default"] == 72
    assert _flops(nn.AdaptiveAvgPool2d(3), x)["aten.adaptive_avg_pool2d.default"] == \
        2 * 4 * 9 * 3 * 3
    # A multiply-add per tap: 4 for bilinear; nearest copies.
    assert _flops(nn.Upsample(scale_factor=2, mode="bilinear"), x)[
        "aten.upsample_bilinear2d.vec"] == 2 * 4 * 256 * 8
    assert _flops(nn.Upsample(scale_factor=2), x)["aten.upsample_nearest2d.vec"] == 2 * 4 * 256


def test_conv_transpose_and_recurrent_flops() -> None:
    x = torch.randn(2, 4, 8, 8)
    # torch's convention: per input position, per weight element, per sample.
    assert _flops(nn.ConvTranspose2d(4, 6, 3, stride=2), x)["aten.conv_transpose2d.input"] \
        == 2 * 2 * 64 * 4 * 6 * 9
    # 2 per weight element and 1 per bias element, per step and sample: a GRU of 3 gates.
    gru = _Call(lambda m, x: m.layers[0](x)[0], nn.GRU(5, 8, batch_first=True))
    assert _flops(gru, torch.randn(3, 6, 5))["aten.gru.input"] == \
        6 * 3 * (2 * 24 * (5 + 8) + 2 * 24)
    lstm = _Call(lambda m, x: m.layers[0](x)[0], nn.LSTM(5, 8, 2, bidirectional=True))
    per_direction = 2 * 32 * (5 + 8) + 2 * 32 * (16 + 8) + 4 * 32
    assert _flops(lstm, torch.randn(6, 3, 5))["aten.lstm.input"] == 6 * 3 * 2 * per_direction


@pytest.mark.parametrize("shape,src", [((4, 3), f(4, 3)), ((4, 3), f(3)),
                                       ((2, 3), f(2, 3).float())])
def test_copy_rewrite_is_the_broadcast_and_has_a_gradient(shape, src) -> None:
    # `x[:, 1:4] = y` exports a functional copy, which eager torch cannot differentiate.
    x = f(*shape)
    want = aten.copy.default(x, src)
    leaf = src.clone().requires_grad_()
    got = DECOMPOSITIONS[aten.copy.default](x, leaf)
    torch.testing.assert_close(got, want)
    assert got.dtype == x.dtype and got.shape == x.shape
    (grad,) = torch.autograd.grad(got.sum(), leaf)
    torch.testing.assert_close(grad, torch.full_like(src, got.numel() / src.numel()))
    model = _setitem(lambda y, v: y.__setitem__((slice(None), slice(1, 3)), v))
    assert aten.copy.default not in _ops(model, (x1, torch.randn(2, 2, 8)))
