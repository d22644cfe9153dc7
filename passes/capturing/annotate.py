"""annotate: shapes, dtypes, forward FLOPs and bytes of every node of a captured graph.

Reads `node.meta["val"]` (the FakeTensor, or tuple of them, torch.export records). Writes on
every node of a copy of the graph:
- `autopar_tensor`: `TensorSpec` of the value, a tuple of them (None for non-tensor items)
  for multi-output ops, None for nodes without a tensor value.
- `autopar_flops`, `autopar_bytes`: forward cost of the whole (unsharded) op. Plain ints for
  static graphs; sympy expressions over the graph's size symbols when dims are dynamic
  (evaluate them with `size_hints`).

FLOPs come from torch.utils.flop_counter's registry where it has a formula (mm, addmm, bmm,
baddbmm, convolution, fused attention) and follow its conventions (a multiply-add is 2 FLOPs,
attention counts the full score matrix even when causal); the ops the training IR keeps
whole (linear, matmul, conv1d/2d/3d and their transposes, scaled_dot_product_attention,
norms, losses, pooling windows, interpolation taps, recurrent layers) are
counted here. Bytes are read (each distinct input once) plus written; views move none,
embedding reads its rows.
"""

from __future__ import annotations

import copy
import math
import operator
from collections.abc import Callable

import sympy
import torch
import torch.utils._pytree as pytree
from torch import fx
from torch.utils import flop_counter

from autopar.passes.capturing.find_saved import SAVED_OPS
from autopar.rules import einsum as einsum_rule
from autopar.values.graph_module import argument_nodes, graph_module
from autopar.values.specs import BYTES, FLOPS, TENSOR, Size, TensorSpec

aten = torch.ops.aten

# Registry ops whose formulas take shapes (register_flop_formula without get_raw).
_REGISTRY = frozenset({
    aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.convolution, aten._convolution,
    aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention,
})
# Aliases and metadata changes: nothing moves. Whether a reshape copies depends on strides
# the device's kernels chose; only a materialised broadcast is counted (on any device).
_VIEWS = frozenset({
    aten.view, aten._unsafe_view, aten.reshape, aten.transpose, aten.permute, aten.expand,
    aten.expand_as, aten.unsqueeze, aten.squeeze, aten.t, aten.alias, aten.view_as,
    aten.slice, aten.select, aten.narrow, aten.split, aten.split_with_sizes, aten.chunk,
    aten.unbind, aten.unflatten, aten.flatten, aten.as_strided, aten.detach, aten.detach_,
    aten.movedim, aten.diagonal, aten.lift_fresh, aten.broadcast_tensors,
})
# Data movement without arithmetic: bytes in + out, no FLOPs.
_COPIES = frozenset({
    aten.clone, aten.contiguous, aten._to_copy, aten.to, aten.cat, aten.stack, aten.repeat,
    aten.repeat_interleave, aten.index_select, aten.gather, aten.index, aten.copy,
    aten.copy_, aten.lift_fresh_copy, aten.tril, aten.triu, aten.pad, aten.constant_pad_nd,
    aten.roll, aten.flip,
})
# New tensors from nothing: only the output is written.
_FACTORIES = frozenset({
    aten.arange, aten.zeros, aten.ones, aten.full, aten.empty, aten.empty_strided,
    aten.zeros_like, aten.ones_like, aten.full_like, aten.empty_like, aten.new_zeros,
    aten.new_ones, aten.new_full, aten.new_empty, aten.scalar_tensor, aten.eye,
    aten.linspace, aten.rand, aten.randn, aten.randint, aten.rand_like, aten.randn_like,
})
# FLOPs per element of the largest tensor involved, for ops worth more than one.
_PER_ELEMENT = {
    aten.layer_norm: 8, aten.native_layer_norm: 8, aten.group_norm: 8,
    aten.native_group_norm: 8, aten.batch_norm: 8, aten.native_batch_norm: 8,
    aten._native_batch_norm_legit: 8, aten._native_batch_norm_legit_no_training: 8,
    aten.instance_norm: 8, aten.rms_norm: 5, aten._fused_rms_norm: 5,
    aten.softmax: 5, aten._softmax: 5, aten._safe_softmax: 5, aten.log_softmax: 5,
    aten._log_softmax: 5, aten.mse_loss: 3,
}
_SOFTMAX_FLOPS = 5

# `flop_source`'s answers besides "estimate: N per element".
FORMULA = "formula"
DATA_MOVEMENT = "data movement"  # max, subtract, exp, sum, divide (or log) per element


def annotate(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of `gm` whose nodes carry `autopar_tensor`, `autopar_flops`, `autopar_bytes`,
    with a memo of what its ops save (`find_saved.SAVED_OPS`) that its derived graphs share."""
    # A deep-copied graph has shallow copies of the meta dicts: FakeTensors shared, input intact.
    result = graph_module(gm, copy.deepcopy(gm.graph))
    result.meta.update(gm.meta)
    result.meta.setdefault(SAVED_OPS, {})
    for node in result.graph.nodes:
        node.meta[TENSOR] = _spec_of(node.meta.get("val"))
        flops, nbytes = _cost(node)
        node.meta[FLOPS], node.meta[BYTES] = _normalise(flops), _normalise(nbytes)
    return result


def size_hints(gm: fx.GraphModule) -> dict[sympy.Symbol, int]:
    """Each size symbol of `gm`'s tensor shapes mapped to its value in the example inputs
    (empty for a graph of static shapes, whatever symbols tracing made on the way)."""
    used: set[sympy.Symbol] = set()
    shape_env = None
    for node in gm.graph.nodes:
        for value in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(value, torch.Tensor):
                for size in value.shape:
                    if isinstance(size, torch.SymInt):
                        used |= size.node.expr.free_symbols
            shape_env = shape_env or getattr(getattr(value, "fake_mode", None), "shape_env",
                                             None)
    if shape_env is None or not used:
        return {}
    hints = (shape_env.backed_var_to_val if hasattr(shape_env, "backed_var_to_val")
             else shape_env.var_to_val)
    # A symbol export found equal to another is replaced in every expression.
    return {symbol: int(hint) for symbol, hint in hints.items()
            if symbol not in shape_env.replacements and symbol in used}


def _spec_of(value: object) -> TensorSpec | tuple[TensorSpec | None, ...] | None:
    if isinstance(value, torch.Tensor):
        return _tensor_spec(value)
    if isinstance(value, (tuple, list)):
        return tuple(_tensor_spec(v) if isinstance(v, torch.Tensor) else None for v in value)
    return None


def _tensor_spec(value: torch.Tensor) -> TensorSpec:
    concrete: list[int] = []
    symbolic: list[Size] = []
    for size in value.shape:
        expr = size.node.expr if isinstance(size, torch.SymInt) else size
        if isinstance(expr, sympy.Expr) and not expr.is_number:
            # The example's value; a size first computed after tracing asks the shape env.
            hint = size.node.hint
            concrete.append(int(hint if hint is not None else
                                size.node.shape_env.size_hint(expr)))
            symbolic.append(expr)
        else:
            concrete.append(int(expr))
            symbolic.append(int(expr))
    dynamic = any(isinstance(size, sympy.Expr) for size in symbolic)
    return TensorSpec(tuple(concrete), value.dtype, tuple(symbolic) if dynamic else None)


def _cost(node: fx.Node) -> tuple[Size, Size]:
    """(FLOPs, bytes) of one node."""
    outputs = _tensors(node.meta[TENSOR])
    if node.op != "call_function" or not outputs or node.target is operator.getitem:
        return 0, 0
    packet = getattr(node.target, "overloadpacket", None)
    inputs = _input_specs(node)
    read = sum((s.sym_nbytes for s in inputs), 0)
    written = sum((s.sym_nbytes for s in outputs), 0)
    if packet in _FACTORIES:
        return 0, written
    if packet is aten.embedding:  # reads the indices and the gathered rows, not the table
        return 0, _arg_spec(node, 1).sym_nbytes + 2 * written
    if packet in _VIEWS:
        return 0, read + written if _materialises_broadcast(node, packet) else 0
    if packet is aten.to and inputs and inputs[0].dtype == outputs[0].dtype:
        return 0, 0  # returns its input unchanged
    if packet in _COPIES:
        return 0, read + written
    formula = _FORMULAS.get(packet)
    if formula is not None:
        flops = formula(node)
    elif packet in _REGISTRY:
        flops = _registry_flops(node, packet)
    else:
        largest = max((*inputs, *outputs), key=lambda s: s.numel)
        flops = _PER_ELEMENT.get(packet, 1) * _numel(largest)
    return flops, read + written


def flop_source(node: fx.Node) -> str:
    """How `annotate` counts the FLOPs of an annotated node: FORMULA (its own formula or
    torch's flop registry), DATA_MOVEMENT (no FLOPs) or "estimate: N per element".

    Follows `_cost`'s order of lookups, beside it so that the two change together.
    """
    packet = getattr(node.target, "overloadpacket", None)
    if (node.op != "call_function" or not _tensors(node.meta[TENSOR])
            or packet in _FACTORIES or packet is aten.embedding or packet in _VIEWS
            or packet in _COPIES):
        return DATA_MOVEMENT
    if packet in _FORMULAS or packet in _REGISTRY:
        return FORMULA
    return f"estimate: {_PER_ELEMENT.get(packet, 1)} per element"


def _registry_flops(node: fx.Node, packet: object) -> Size:
    # The registered formulas read `.shape` of tensor arguments; shape tuples (with sympy
    # sizes for dynamic dims) pass through unchanged, so the result is symbolic too.
    def shape_of(arg: object) -> object:
        spec = arg.meta.get(TENSOR) if isinstance(arg, fx.Node) else None
        return _dims(spec) if isinstance(spec, TensorSpec) else arg

    args, kwargs = pytree.tree_map(shape_of, (node.args, node.kwargs))
    out = node.meta[TENSOR]
    out_shape = tuple(s and _dims(s) for s in out) if isinstance(out, tuple) else _dims(out)
    return flop_counter.flop_registry[packet](*args, out_val=out_shape, **kwargs)


def _linear_flops(node: fx.Node) -> Size:
    x, out = _arg_spec(node, 0), node.meta[TENSOR]
    has_bias = _arg_spec(node, 2, "bias") is not None
    return _numel(out) * (2 * _dims(x)[-1] + (1 if has_bias else 0))


def _matmul_flops(node: fx.Node) -> Size:
    # Every output element is a dot product over the contracted dim, whatever the ranks.
    return 2 * _numel(node.meta[TENSOR]) * _dims(_arg_spec(node, 0))[-1]


def _sdpa_flops(node: fx.Node) -> Size:
    q, k, v = (_dims(_arg_spec(node, i)) for i in range(3))
    return flop_counter.sdpa_flop_count(_as_4d(q), _as_4d(k), _as_4d(v))


def _conv_flops(node: fx.Node) -> Size:
    # conv1d/2d/3d as exported; the registry's formula counts aten.convolution the same way.
    x, w, out = _dims(_arg_spec(node, 0)), _dims(_arg_spec(node, 1)), _dims(node.meta[TENSOR])
    if len(x) < len(w):  # unbatched: one sample
        x, out = (1, *x), (1, *out)
    return flop_counter.conv_flop_count(list(x), list(w), list(out))


def _einsum_flops(node: fx.Node) -> Size:
    # A multiply-add per point of the space of all the equation's letters (for two or more
    # operands); summing one operand costs an add per input element.
    equation, operands = node.args[0], node.args[1]
    parsed = einsum_rule.parse(equation, len(operands))
    specs = [o.meta.get(TENSOR) for o in operands]
    if parsed is None or not all(isinstance(s, TensorSpec) for s in specs):
        return _numel(node.meta[TENSOR])
    sizes: dict[str, Size] = {}
    for term, spec in zip(parsed[0], specs):
        sizes.update(zip(term, _dims(spec)))
    space = math.prod(sizes.values())
    return 2 * space if len(operands) > 1 else space


def _cross_entropy_flops(node: fx.Node) -> Size:
    logits, target = _arg_spec(node, 0), _arg_spec(node, 1)
    return _SOFTMAX_FLOPS * _numel(logits) + _numel(target)


def _conv_transpose_flops(node: fx.Node) -> Size:
    # torch's formula for a transposed convolution: a multiply-add per input position, per
    # weight element (W = [C_in, C_out / groups, *kernel]), per sample.
    x, w, out = _dims(_arg_spec(node, 0)), _dims(_arg_spec(node, 1)), _dims(node.meta[TENSOR])
    if len(x) < len(w):  # unbatched: one sample
        x, out = (1, *x), (1, *out)
    return flop_counter.conv_flop_count(list(x), list(w), list(out), transposed=True)


def _pool_flops(node: fx.Node) -> Size:
    # max_pool / avg_pool: a compare or an add per element of each output's window.
    out, kernel = _first(node.meta[TENSOR]), _arg(node, 1, "kernel_size")
    spatial = _SPATIAL[node.target.overloadpacket]
    kernel = [kernel] if isinstance(kernel, int) else list(kernel)
    if len(kernel) == 1:  # one size for every spatial dim
        kernel = kernel * spatial
    return _numel(out) * math.prod(kernel)


def _adaptive_pool_flops(node: fx.Node) -> Size:
    # Output i of a dim of size n from m reads about ceil(m / n) inputs (windows overlap by
    # at most one when n does not divide m): each input read once when pooling down.
    src, out = _dims(_arg_spec(node, 0)), _dims(_first(node.meta[TENSOR]))
    spatial = _SPATIAL[node.target.overloadpacket]
    window = math.prod(-(-m // n) for m, n in zip(src[-spatial:], out[-spatial:]))
    return _numel(_first(node.meta[TENSOR])) * window


def _upsample_flops(node: fx.Node) -> Size:
    # A multiply-add per tap (2 for linear, 4 bilinear, 8 trilinear, 16 bicubic) per output
    # element; nearest copies one input element per output element (counted as 1).
    taps = _TAPS[node.target.overloadpacket]
    return _numel(node.meta[TENSOR]) * (2 * taps if taps > 1 else 1)


def _recurrent_flops(node: fx.Node) -> Size:
    # lstm / gru / rnn: at every step of every sample, each weight matrix (W_ih, W_hh, W_hr
    # of each layer and direction) is a multiply-add per element and each bias an add. The
    # gates' nonlinearities (a few FLOPs per gate element) are left out: small against the
    # products once input + hidden is in the tens.
    x = _dims(_arg_spec(node, 0))
    steps, batch = (x[1], x[0]) if _arg(node, 8, "batch_first", False) else (x[0], x[1])
    per_step = sum((2 * _numel(p) if p.ndim == 2 else _numel(p))
                   for p in (a.meta[TENSOR] for a in _arg(node, 2, "params")))
    return steps * batch * per_step


_SPATIAL = {
    **{getattr(aten, f"{kind}{k}d"): k for k in (1, 2, 3)
       for kind in ("max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool")},
    **{getattr(aten, f"max_pool{k}d_with_indices"): k for k in (1, 2, 3)},
    aten._adaptive_avg_pool2d: 2, aten._adaptive_avg_pool3d: 3,
}
_TAPS = {
    aten.upsample_nearest1d: 1, aten.upsample_nearest2d: 1, aten.upsample_nearest3d: 1,
    aten._upsample_nearest_exact1d: 1, aten._upsample_nearest_exact2d: 1,
    aten._upsample_nearest_exact3d: 1, aten.upsample_linear1d: 2, aten.upsample_bilinear2d: 4,
    aten._upsample_bilinear2d_aa: 4, aten.upsample_trilinear3d: 8, aten.upsample_bicubic2d: 16,
    aten._upsample_bicubic2d_aa: 16,
}

_FORMULAS: dict[object, Callable[[fx.Node], Size]] = {
    aten.linear: _linear_flops, aten.matmul: _matmul_flops,
    aten.scaled_dot_product_attention: _sdpa_flops, aten.cross_entropy_loss: _cross_entropy_flops,
    aten.conv1d: _conv_flops, aten.conv2d: _conv_flops, aten.conv3d: _conv_flops,
    aten.conv_transpose1d: _conv_transpose_flops, aten.conv_transpose2d: _conv_transpose_flops,
    aten.conv_transpose3d: _conv_transpose_flops, aten.einsum: _einsum_flops,
    **{packet: _pool_flops for packet in _SPATIAL if "adaptive" not in str(packet)},
    **{packet: _adaptive_pool_flops for packet in _SPATIAL if "adaptive" in str(packet)},
    **dict.fromkeys(_TAPS, _upsample_flops),
    **dict.fromkeys((aten.lstm, aten.gru, aten.rnn_tanh, aten.rnn_relu), _recurrent_flops),
}


def _as_4d(dims: tuple[Size, ...]) -> tuple[Size, ...]:
    """(..., heads, seq, dim) -> (batch, heads, seq, dim), as torch's attention formula wants."""
    if len(dims) >= 4:
        return (math.prod(dims[:-3]), *dims[-3:])
    return (1,) * (4 - len(dims)) + tuple(dims)


def _materialises_broadcast(node: fx.Node, packet: object) -> bool:
    """A reshape that folds an expanded (stride 0) dim into others must copy, on any device.

    This is how grouped-query attention repeats its key/value heads (expand + reshape).
    """
    if packet not in (aten.reshape, aten.flatten):
        return False

    def broadcast(arg: fx.Node) -> bool:
        # Concrete sizes and literal strides only: comparing SymInts would add shape guards.
        sizes, strides = arg.meta[TENSOR].shape, arg.meta["val"].stride()
        return any(type(st) is int and st == 0 and n != 1 for n, st in zip(sizes, strides))

    return broadcast(node.args[0]) and not broadcast(node)


def _arg(node: fx.Node, index: int, name: str, default: object = None) -> object:
    """Argument `name` of `node`, positional at `index` or by keyword, else `default`."""
    return node.args[index] if index < len(node.args) else node.kwargs.get(name, default)


def _first(spec: TensorSpec | tuple) -> TensorSpec:
    """The first output of a (possibly multi-output) node."""
    return spec[0] if isinstance(spec, tuple) else spec


def _arg_spec(node: fx.Node, index: int, name: str | None = None) -> TensorSpec | None:
    arg = node.args[index] if index < len(node.args) else node.kwargs.get(name)
    return arg.meta.get(TENSOR) if isinstance(arg, fx.Node) else None


def _input_specs(node: fx.Node) -> list[TensorSpec]:
    seen = dict.fromkeys(argument_nodes(node))
    return [n.meta[TENSOR] for n in seen if isinstance(n.meta.get(TENSOR), TensorSpec)]


def _tensors(spec: object) -> list[TensorSpec]:
    specs = spec if isinstance(spec, tuple) else (spec,)
    return [s for s in specs if s is not None]


def _dims(spec: TensorSpec) -> tuple[Size, ...]:
    return spec.sym_shape if spec.sym_shape is not None else spec.shape


def _numel(spec: TensorSpec) -> Size:
    return math.prod(_dims(spec))


def _normalise(value: Size) -> Size:
    """Plain ints for static sizes; sympy only where a symbol remains."""
    if isinstance(value, sympy.Basic):
        return int(value) if value.is_number else value
    return int(value)
