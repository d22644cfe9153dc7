"""Saved pass (proposed, not yet wired into build_problem): which tensors autograd really
keeps for the backward, per op.

build_problem charges every op on the gradient path its output until the end of the forward.
What autograd keeps is different, per op: `add` keeps nothing, `mul` keeps its inputs, `relu`
its output, `gelu` and `linear` their inputs, and many ops keep tensors they make inside
(cross-entropy its log-softmax, layer norm its mean and rstd, attention its logsumexp). On
the examples (one device) the charge is 12% (GPT) to 23% (Llama) too high, and op by op
much more (benchmarks/memory_fidelity.py).

`find_saved(gm)` runs each op of the annotated graph once on `meta` tensors of its input
specs (no memory, no data) under saved-tensor hooks, with `requires_grad` set on the
floating inputs that carry a gradient (what an op saves depends on it: `mul` keeps `a` only
when `b` needs a gradient), and classifies each saved tensor by its storage: one of the op's
tensor inputs (by position), one of its outputs, or an internal tensor (its bytes at the
node's shapes). A kept activation is then a storage some op saves: the producer's output
when a consumer saves it as an input or the op saves its own output, plus the internals.

Caveat: on `meta` an op may dispatch to another kernel than on the device (attention runs
its math decomposition, which saves the attention matrix, where CPU and CUDA kernels save
the logsumexp): internals of such ops are an upper bound. Ops with symbolic shapes are
skipped (absent from the result).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from autopar.passes.build_problem import gradient_path
from autopar.specs import TENSOR, TensorSpec


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
    and `kwargs` must be meta (or small) tensors with `requires_grad` set as in training."""
    leaves = [leaf for leaf in pytree.tree_leaves((args, kwargs))
              if isinstance(leaf, torch.Tensor)]
    packed: list[torch.Tensor] = []

    def pack(tensor):
        packed.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = target(*args, **kwargs)
    outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]

    # A meta storage has no address, but each storage is its own object: a view shares it.
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
    module docstring). Reads `autopar_tensor`; writes nothing."""
    on_path = gradient_path(gm)
    result = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or not on_path[node.name]:
            continue
        specs = [n.meta.get(TENSOR) for n in node.all_input_nodes]
        if not all(isinstance(s, TensorSpec) and _concrete(s) for s in specs):
            continue

        def meta(value):
            if not isinstance(value, fx.Node):
                return value
            spec: TensorSpec = value.meta[TENSOR]
            tensor = torch.empty(spec.shape, dtype=spec.dtype, device="meta")
            differentiable = spec.dtype.is_floating_point or spec.dtype.is_complex
            return tensor.requires_grad_(differentiable and on_path[value.name])

        args, kwargs = pytree.tree_map(meta, (node.args, node.kwargs))
        try:
            result[node.name] = saved_by(node.target, args, kwargs)
        except (RuntimeError, NotImplementedError, TypeError):
            continue  # no meta kernel: leave the op to the output-kept rule
    return result
