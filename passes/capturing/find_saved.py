"""Saved pass: which tensors autograd really keeps for the backward, per op.

What autograd keeps differs per op: `add` keeps nothing, `mul` keeps its inputs, `relu` its
output, `gelu` and `linear` their inputs, and many ops keep tensors they make inside
(cross-entropy its log-softmax, layer norm its mean and rstd, attention its logsumexp).
Charging every op's output until the end of the forward instead was 12% (GPT) to 23%
(Llama) too high on the examples, and op by op much more (benchmarks/memory_fidelity.py).
build_problem charges what this pass finds (`kept_outputs` and the internal bytes).

`find_saved(gm)` runs each op of the annotated graph once on fake CPU tensors of its input
specs (no memory, no data; the kernels CPU would choose) under saved-tensor hooks, with
`requires_grad` set on the floating inputs that carry a gradient (what an op saves depends
on it: `mul` keeps `a` only when `b` needs a gradient), and classifies each saved tensor by
its storage: one of the op's tensor inputs (by position), one of its outputs, or an
internal tensor (its bytes at the node's shapes). A kept activation is then a storage some
op saves: the producer's output when a consumer saves it as an input or the op saves its
own output, plus the internals.

An op's answer depends only on its target, its arguments' specs and which of them carry a
gradient: it is kept by that key in the graph's meta (`SAVED_OPS`), whose dict the graphs
derived from an annotated one (folded, split into stages) share, so that the planning of a
model's stages and candidates runs each op once per capture.

Fake CPU tensors, not `meta` ones: on `meta` attention runs its math decomposition, which
saves the whole attention matrix, where the CPU and CUDA kernels save q, k, v, the output
and the logsumexp. Kernels of other devices may still save other internals than CPU's.
Ops with symbolic shapes are skipped (absent from the result).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

from autopar.passes.capturing.gradient_path import gradient_path
from autopar.values.graph_module import argument_nodes
from autopar.values.specs import BYTES, TENSOR, TensorSpec

# The graph meta key of what ops save, by op key (module docstring; None: no fake kernel).
SAVED_OPS = "autopar_saved_ops"


@dataclass(frozen=True)
class Saved:
    """What one op saves: positions among its tensor inputs (graph order of its arguments)
    and among its outputs, and the bytes of the tensors it makes and saves inside."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    internal_bytes: int


def _concrete(spec: TensorSpec) -> bool:
    return all(isinstance(d, int) for d in spec.shape)


def saved_by(target, args: tuple, kwargs: dict) -> Saved:
    """What `target(*args, **kwargs)` saves for its backward; the tensor leaves of `args`
    and `kwargs` must be fake, meta or small tensors with `requires_grad` set as in
    training."""
    leaves = [leaf for leaf in pytree.tree_leaves((args, kwargs))
              if isinstance(leaf, torch.Tensor)]
    packed: list[torch.Tensor] = []

    def pack(tensor):
        packed.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = target(*args, **kwargs)
    outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]

    # A fake storage has no address, but each storage is its own object: a view shares it.
    def key(tensor: torch.Tensor) -> int:
        return tensor.untyped_storage()._cdata

    by_input = {key(t): i for i, t in enumerate(leaves)}
    by_output = {key(t): i for i, t in enumerate(outputs)}
    inputs, outs, internal = set(), set(), {}
    for tensor in packed:
        k = key(tensor)
        if k in by_input:
            inputs.add(by_input[k])
        elif k in by_output:
            outs.add(by_output[k])
        else:
            internal[k] = tensor.untyped_storage().nbytes()
    return Saved(tuple(sorted(inputs)), tuple(sorted(outs)), sum(internal.values()))


def find_saved(gm: fx.GraphModule) -> dict[str, Saved]:
    """Per op node on the gradient path (by name), what autograd saves for it (see the
    module docstring). Reads `autopar_tensor`; adds the ops it runs to `SAVED_OPS`."""
    on_path = gradient_path(gm)
    result = {}
    # Repeated blocks repeat the same ops on the same shapes: run each once.
    known: dict[str, Saved | None] = gm.meta.setdefault(SAVED_OPS, {})
    for node in gm.graph.nodes:
        if node.op != "call_function" or not on_path[node.name]:
            continue
        specs = [n.meta.get(TENSOR) for n in node.all_input_nodes]
        if not all(isinstance(s, TensorSpec) and _concrete(s) for s in specs):
            continue
        key = repr((node.target, pytree.tree_map_only(
            fx.Node, lambda n: (n.meta[TENSOR], on_path[n.name]), (node.args, node.kwargs))))
        if key in known:
            if known[key] is not None:
                result[node.name] = known[key]
            continue
        known[key] = None

        def meta(value):
            if not isinstance(value, fx.Node):
                return value
            spec: TensorSpec = value.meta[TENSOR]
            tensor = torch.empty(spec.shape, dtype=spec.dtype, device="cpu")
            differentiable = spec.dtype.is_floating_point or spec.dtype.is_complex
            return tensor.requires_grad_(differentiable and on_path[value.name])

        try:
            with FakeTensorMode():
                args, kwargs = pytree.tree_map(meta, (node.args, node.kwargs))
                result[node.name] = known[key] = saved_by(node.target, args, kwargs)
        except (RuntimeError, NotImplementedError, TypeError):
            continue  # no fake kernel: leave the op to the output-kept rule
    return result


def storage_base(node: fx.Node) -> tuple[fx.Node, int]:
    """The node (and output position) whose storage `node`'s value lives in: itself, or
    through views (ops that move no bytes) and `getitem`s the op that wrote it. Views with
    several outputs (split, broadcast_tensors) view their one input, or input k of as
    many."""
    _, base, index = storage_path(node)
    return base, index


def storage_path(node: fx.Node) -> tuple[list[fx.Node], fx.Node, int]:
    """`storage_base(node)` with the view ops met on the way there, in order (the
    `getitem`s not among them; the last may be a view of several inputs it can't follow)."""
    views, index = [], 0
    while node.op == "call_function":
        if node.target is operator.getitem:
            node, index = node.args[0], node.args[1]
            continue
        if node.meta.get(BYTES, 0) != 0:
            break
        sources = [n for n in node.all_input_nodes if isinstance(n.meta.get(TENSOR),
                                                                 TensorSpec)]
        outputs = node.meta.get(TENSOR)
        count = len(outputs) if isinstance(outputs, tuple) else 1
        views.append(node)
        if len(sources) == 1:
            node, index = sources[0], 0
        elif len(sources) == count and index < count:
            node, index = sources[index], 0
        else:
            break
    return views, node, index


def written_base(node: fx.Node) -> fx.Node | None:
    """The op that wrote `node`'s value, reached through views of one input each (a
    transpose, a slice, an expand): `node` itself when it writes its output; None for a
    value some other way (one of several outputs, a placeholder, a view of several inputs).
    Recomputing that op and taking the views again rebuilds `node`."""
    while node.op == "call_function" and node.target is not operator.getitem:
        if node.meta.get(BYTES, 0) != 0:
            return node if isinstance(node.meta.get(TENSOR), TensorSpec) else None
        sources = [n for n in node.all_input_nodes
                   if isinstance(n.meta.get(TENSOR), TensorSpec)]
        if len(sources) != 1:
            return None
        node = sources[0]
    return None


def kept_outputs(gm: fx.GraphModule, saved: dict[str, Saved]) -> dict[str, frozenset[int]]:
    """Per op node with a `saved` entry, the positions of its outputs that some op keeps
    for the backward: the op itself, or a consumer saving it as an input, directly or
    through views (nodes that move no bytes) and `getitem`s of a multi-output op. A
    consumer on the gradient path without an entry is assumed to keep all its tensor
    inputs; one off it keeps nothing."""
    by_name = {node.name: node for node in gm.graph.nodes}
    on_path = gradient_path(gm)
    kept: dict[str, set[int]] = {name: set(entry.outputs) for name, entry in saved.items()}

    def mark(node: fx.Node) -> None:
        node, index = storage_base(node)
        if node.name in kept:
            kept[node.name].add(index)

    for node in gm.graph.nodes:
        if node.op != "call_function" or not on_path[node.name]:
            continue
        leaves = [leaf for leaf in argument_nodes(node) if leaf.name in by_name]
        positions = (saved[node.name].inputs if node.name in saved
                     else range(len(leaves)))
        for position in positions:
            mark(leaves[position])
    return {name: frozenset(indices) for name, indices in kept.items()}
