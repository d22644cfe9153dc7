"""Plan nodes grouped by layer, for the text summary and the report alike.

A node's group is a key of its module path (`NodePlan.module`), `TOP` for nodes of the root
module (its inputs, outputs and own operators). Two keys, one per granularity:

    layer_of        "layers.3.attn.qkv" -> "layers.3"           a layer: the path up to
                    "ln_f"              -> "ln_f"               its first numeric index, or
                                                                the whole path without one
    layer_pattern   "layers.3.attn.qkv" -> "layers.*.attn.qkv"  a submodule of every repeated
                                                                block: each index read as *

The report draws a lane and a bar per `layer_of` group; the summary writes a row per
`layer_pattern` group, so that repeated blocks share a row.

`group_layers` groups by either key in one order, the order the model runs them: by each
group's first operator in graph order (`plan.nodes`), so that parameters, which the graph
lists first, do not decide it; a group without operators (only parameters or inputs) by its
first node. Every node is in exactly one group, and a group's nodes are in graph order.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from autopar.values.plan import NodePlan, Plan

TOP = "(top)"
_FIRST_INDEX = re.compile(r"^(.*?\.\d+)(?:\.|$)")
_INDEX = re.compile(r"\.\d+(?=\.|$)")


def layer_of(module: str) -> str:
    """The layer of a module path: up to its first numeric index (module docstring)."""
    if not module:
        return TOP
    match = _FIRST_INDEX.match(module)
    return match.group(1) if match else module


def layer_pattern(module: str) -> str:
    """The pattern of a module path, its numeric indices read as * (module docstring):
    `"layers.3.attn"` -> `"layers.*.attn"`."""
    if not module:
        return TOP
    return _INDEX.sub(".*", module)


@dataclass(frozen=True)
class Layer:
    """One group: its key's value (`name`) and its nodes, in graph order, as indices into
    `plan.nodes`."""

    name: str
    indices: tuple[int, ...]


def group_layers(plan: Plan, key: Callable[[str], str] = layer_of) -> tuple[Layer, ...]:
    """The plan's nodes grouped by `key` of their module path (`layer_of` or
    `layer_pattern`), in the order the model runs them (module docstring)."""
    members: dict[str, list[int]] = defaultdict(list)
    first_op: dict[str, int] = {}
    for index, node in enumerate(plan.nodes):
        name = key(node.module)
        members[name].append(index)
        if node.role == "op":
            first_op.setdefault(name, index)
    order = sorted(members, key=lambda name: first_op.get(name, members[name][0]))
    return tuple(Layer(name, tuple(members[name])) for name in order)


def layer_nodes(plan: Plan, layer: Layer) -> list[NodePlan]:
    """The nodes of `layer`, in graph order."""
    return [plan.nodes[i] for i in layer.indices]
