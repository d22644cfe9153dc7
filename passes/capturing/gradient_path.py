"""Gradient-path pass: which nodes carry a gradient in the backward.

Reads `autopar_role`, `autopar_frozen`, `autopar_tensor` and `autopar_boundary`; returns a
dict, writes nothing. A node is on the gradient path when its value depends on a trained
parameter (`trained`: not a frozen one) through floating-point values and ops that pass
gradients: integer and boolean results (indices, masks) and factories (`zeros_like(x)`
depends on x's shape only) carry none. In a pipeline
stage's graph of a training step, a floating-point input the previous stage sends
(`autopar_boundary`) carries a gradient too: the one the stage sends back. Nothing does in
a forward-only graph (`is_training`).
"""

from __future__ import annotations

import torch.fx as fx

from autopar.passes.capturing.capture import is_training
from autopar.rules import factories
from autopar.values.specs import BOUNDARY, FROZEN, ROLE, TENSOR, TensorSpec


def gradient_path(gm: fx.GraphModule) -> dict[str, bool]:
    """Which nodes' values depend on a trained parameter through floating-point values and
    ops that pass gradients, so carry a gradient. Integer and boolean results (indices,
    masks) carry none, whatever they were computed from."""
    on_path: dict[str, bool] = {}
    receives_gradients = is_training(gm)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            on_path[node.name] = trained(node) or (
                receives_gradients and bool(node.meta.get(BOUNDARY)) and any(
                    is_differentiable(spec) for spec in tensor_outputs(node)))
        elif node.op == "output":
            on_path[node.name] = any(on_path[n.name] for n in node.all_input_nodes)
        else:
            on_path[node.name] = passes_gradient(node) and any(
                on_path[n.name] for n in node.all_input_nodes) and any(
                is_differentiable(spec) for spec in tensor_outputs(node))
    return on_path


def trained(node: fx.Node) -> bool:
    """Whether `node` is a parameter the optimizer steps: not one frozen (`autopar_frozen`)."""
    return node.meta.get(ROLE) == "parameter" and not node.meta.get(FROZEN, False)


def passes_gradient(node: fx.Node) -> bool:
    """Whether autograd carries a gradient from `node`'s output to its inputs: not for the
    factories (`zeros_like(x)` depends on x's shape only)."""
    target = getattr(node.target, "overloadpacket", None)
    return node.target not in factories.NO_GRADIENT and target not in factories.NO_GRADIENT


def is_differentiable(spec: TensorSpec) -> bool:
    """Whether a tensor of `spec` can carry a gradient (floating or complex)."""
    return spec.dtype.is_floating_point or spec.dtype.is_complex


def tensor_outputs(node: fx.Node) -> tuple[TensorSpec, ...]:
    """The `TensorSpec`s of `node`'s tensor outputs (none for a node without one)."""
    spec = node.meta.get(TENSOR)
    specs = spec if isinstance(spec, tuple) else (spec,)
    return tuple(s for s in specs if s is not None)
