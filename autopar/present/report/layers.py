"""Which layer a node belongs to, and per-layer totals.

A layer is a module path up to its first numeric index (`"layers.3.attn.qkv"` ->
`"layers.3"`), the whole path when it has no index (`"ln_f"`), or `"(top)"` for nodes of the
root module. Layers are ordered by their first operator in graph order, so that parameters
(which the graph lists first) do not decide the order.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from autopar.values.plan import NodePlan, Plan

TOP = "(top)"
_FIRST_INDEX = re.compile(r"^(.*?\.\d+)(?:\.|$)")


def layer_of(module: str) -> str:
    """The layer name of a module path (see the module docstring)."""
    if not module:
        return TOP
    match = _FIRST_INDEX.match(module)
    return match.group(1) if match else module


@dataclass(frozen=True)
class Layer:
    """A layer's nodes, in graph order, as indices into `plan.nodes`."""

    name: str
    indices: tuple[int, ...]


def group_layers(plan: Plan) -> tuple[Layer, ...]:
    """The plan's nodes grouped by layer; every node is in exactly one group."""
    members: dict[str, list[int]] = defaultdict(list)
    first_op: dict[str, int] = {}
    for index, node in enumerate(plan.nodes):
        name = layer_of(node.module)
        members[name].append(index)
        if node.role == "op":
            first_op.setdefault(name, index)
    # Layers with no operator (only parameters) go last, in order of appearance.
    order = sorted(members, key=lambda n: (n not in first_op, first_op.get(n, members[n][0])))
    return tuple(Layer(name, tuple(members[name])) for name in order)


def layer_nodes(plan: Plan, layer: Layer) -> list[NodePlan]:
    return [plan.nodes[i] for i in layer.indices]
