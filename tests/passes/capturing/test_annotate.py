"""annotate: tensor specs, FLOPs and bytes (static ints and sympy), no mutation of the input."""

import sympy
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.export import Dim
from torch.utils.flop_counter import sdpa_flop_count

from autopar.passes.capturing.annotate import annotate, size_hints
from autopar.passes.capturing.capture import capture
from autopar.values.specs import BYTES, FLOPS, TENSOR, TensorSpec

F32 = 4  # bytes per float32 element


class Lambda(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _annotated(model: nn.Module, inputs: tuple, **kwargs) -> fx.GraphModule:
    return annotate(capture(model, inputs, **kwargs))


def _op(gm: fx.GraphModule, target) -> fx.Node:
    (node,) = [n for n in gm.graph.nodes if n.target == target]
    return node


def test_linear_flops_are_2mnk_and_bytes_are_reads_plus_writes():
    m, k, n = 6, 8, 16
    gm = _annotated(nn.Linear(k, n, bias=False), (torch.randn(m, k),))
    node = _op(gm, torch.ops.aten.linear.default)
    assert node.meta[FLOPS] == 2 * m * n * k
    assert type(node.meta[FLOPS]) is int
    assert node.meta[BYTES] == (m * k + n * k + m * n) * F32
    assert node.meta[TENSOR] == TensorSpec((m, n), torch.float32)


def test_linear_bias_adds_one_flop_per_output():
    gm = _annotated(nn.Linear(8, 16), (torch.randn(6, 8),))
    assert _op(gm, torch.ops.aten.linear.default).meta[FLOPS] == 2 * 6 * 16 * 8 + 6 * 16


def test_placeholders_get_specs_and_cost_nothing():
    gm = _annotated(nn.Embedding(10, 4), (torch.zeros(3, 2, dtype=torch.long),))
    specs = {n.name: n.meta[TENSOR] for n in gm.graph.nodes if n.op == "placeholder"}
    assert sorted(specs.values(), key=str) == sorted(
        [TensorSpec((10, 4), torch.float32), TensorSpec((3, 2), torch.int64)], key=str)
    embedding = _op(gm, torch.ops.aten.embedding.default)
    assert embedding.meta[FLOPS] == 0
    # The indices and the rows gathered, read and written; not the whole table.
    assert embedding.meta[BYTES] == 3 * 2 * 8 + 2 * 3 * 2 * 4 * F32


def test_multi_output_ops_get_a_tuple_of_specs():
    gm = _annotated(Lambda(lambda x: x.split([2, 3], dim=1)[1] * 2), (torch.randn(4, 5),))
    split = _op(gm, torch.ops.aten.split_with_sizes.default)
    assert split.meta[TENSOR] == (TensorSpec((4, 2), torch.float32),
                                  TensorSpec((4, 3), torch.float32))
    assert (split.meta[FLOPS], split.meta[BYTES]) == (0, 0)
    (getitem,) = [n for n in split.users if n.args[1] == 1]
    assert getitem.meta[TENSOR] == TensorSpec((4, 3), torch.float32)
    mul = _op(gm, torch.ops.aten.mul.Tensor)
    assert mul.meta[FLOPS] == 12 and mul.meta[BYTES] == 2 * 12 * F32


def test_views_are_free_and_copies_move_bytes():
    gm = _annotated(Lambda(lambda x: x.t().contiguous().view(-1)), (torch.randn(4, 6),))
    for target in (torch.ops.aten.t.default, torch.ops.aten.view.default):
        assert (_op(gm, target).meta[FLOPS], _op(gm, target).meta[BYTES]) == (0, 0)
    # capture's decompositions turn contiguous() into the copy it is: clone.
    copy = _op(gm, torch.ops.aten.clone.default)
    assert (copy.meta[FLOPS], copy.meta[BYTES]) == (0, 2 * 24 * F32)


def test_reshape_that_materialises_a_broadcast_is_a_copy():
    def repeat_heads(x):  # (b, kv, s, d) -> (b, 2 kv, s, d), as grouped-query attention does
        return x[:, :, None].expand(2, 3, 2, 5, 4).reshape(2, 6, 5, 4)

    gm = _annotated(Lambda(repeat_heads), (torch.randn(2, 3, 5, 4),))
    # capture's decompositions spell the copy out: clone, then a free _unsafe_view. The
    # expanded input is read at its logical size, the same as the copy written.
    assert _op(gm, torch.ops.aten.clone.default).meta[BYTES] == 2 * (2 * 6 * 5 * 4) * F32
    assert _op(gm, torch.ops.aten._unsafe_view.default).meta[BYTES] == 0
    assert _op(gm, torch.ops.aten.expand.default).meta[BYTES] == 0


def test_attention_flops_follow_torch_formula():
    q, kv = torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)
    gm = _annotated(Lambda(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True)), (q, kv, kv))
    node = _op(gm, torch.ops.aten.scaled_dot_product_attention.default)
    assert node.meta[FLOPS] == sdpa_flop_count(q.shape, kv.shape, kv.shape)


def test_matmul_and_bmm_count_2mnk():
    a, b = torch.randn(3, 5, 7), torch.randn(3, 7, 2)
    gm = _annotated(Lambda(lambda a, b: torch.bmm(a, b) + (a @ b)), (a, b))
    assert _op(gm, torch.ops.aten.bmm.default).meta[FLOPS] == 2 * 3 * 5 * 2 * 7
    assert _op(gm, torch.ops.aten.matmul.default).meta[FLOPS] == 2 * 3 * 5 * 2 * 7


def test_einsum_counts_a_multiply_add_per_point_of_its_letters():
    x, w = torch.randn(6, 4, 5), torch.randn(4, 5, 3)  # letters t, e, h and e, h, f
    gm = _annotated(Lambda(lambda x, w: torch.einsum("teh,ehf->etf", x, w)), (x, w))
    assert _op(gm, torch.ops.aten.einsum.default).meta[FLOPS] == 2 * 6 * 4 * 5 * 3


def test_dynamic_batch_gives_sympy_costs_over_its_symbol():
    hidden, out = 8, 16
    batch = Dim("batch")
    gm = _annotated(nn.Linear(hidden, out, bias=False), (torch.randn(4, hidden),),
                    dynamic_shapes=({0: batch},))
    hints = size_hints(gm)
    (symbol,) = hints
    assert hints[symbol] == 4
    node = _op(gm, torch.ops.aten.linear.default)
    spec = node.meta[TENSOR]
    assert spec.shape == (4, out) and spec.sym_shape == (symbol, out)
    flops, nbytes = node.meta[FLOPS], node.meta[BYTES]
    assert isinstance(flops, sympy.Expr) and flops.free_symbols == {symbol}
    for size in (4, 7):
        assert flops.subs(symbol, size) == 2 * size * out * hidden
        assert nbytes.subs(symbol, size) == (size * hidden + out * hidden + size * out) * F32


def test_static_graphs_have_no_size_symbols():
    gm = _annotated(nn.Linear(2, 3), (torch.randn(1, 2),))
    assert size_hints(gm) == {}
    assert all(type(n.meta[FLOPS]) is int and type(n.meta[BYTES]) is int
               for n in gm.graph.nodes)


def test_annotate_returns_a_copy_and_leaves_its_input_alone():
    gm = capture(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),))
    before = {n.name: dict(n.meta) for n in gm.graph.nodes}
    code = gm.code
    result = annotate(gm)
    assert result is not gm and result.graph is not gm.graph
    assert {n.name: dict(n.meta) for n in gm.graph.nodes} == before
    assert gm.code == code
    assert all(TENSOR in n.meta for n in result.graph.nodes)
    x = torch.randn(2, 4)
    args = [torch.randn(4, 4), torch.randn(4), x]
    torch.testing.assert_close(result(*args), gm(*args))
