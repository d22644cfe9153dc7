"""Constraint pass: pin the placement of named tensors before the solve.

`constraints` maps a parameter or buffer name (any of its tied names), a user input's
placeholder name, or a graph node name to its placements, one per mesh axis, as text
(`"S(0),R"`) or a tuple of placements. The returned table keeps only the matching strategy of
each pinned node (for a parameter, the one stored as pinned and not kept gathered).
Reads `autopar_names` and `autopar_tensor`; writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch.fx as fx

from autopar.errors import ShardingError
from autopar.passes.strategies.find_strategies import StrategyTable
from autopar.values.mesh import Mesh
from autopar.values.placement import (
    Placements,
    Shard,
    format_placements,
    parse_placements,
    shard_count,
    smallest_piece,
)
from autopar.values.specs import NAMES, TENSOR


def _node_for(gm: fx.GraphModule, name: str, table: StrategyTable) -> fx.Node:
    for node in gm.graph.nodes:
        if node.name == name or name in node.meta.get(NAMES, ()):
            if node.name in table.strategies:
                return node
    known = [n for node in gm.graph.nodes if node.name in table.strategies
             for n in node.meta.get(NAMES, ())]
    raise ShardingError(f"cannot pin {name!r}: no such tensor in the graph",
                        expected="a parameter or buffer name, or a graph node name",
                        got=repr(name), fix=f"use one of e.g. {known[:5]}")


def _why_impossible(node: fx.Node, placements: Placements, mesh: Mesh) -> str:
    spec = node.meta[TENSOR]
    spec = spec[0] if isinstance(spec, tuple) else spec
    for axis, placement in enumerate(placements):
        if isinstance(placement, Shard):
            if not 0 <= placement.dim < spec.ndim:
                return f"it has no dim {placement.dim} (shape {list(spec.shape)})"
            pieces = shard_count(placements, mesh.shape, placement.dim)
            size = spec.shape[placement.dim]
            if not smallest_piece(size, placements, mesh.shape, placement.dim):
                return (f"dim {placement.dim} of size {size} in {pieces} pieces over axis "
                        f"{mesh.axis_names[axis]!r} leaves a piece empty")
    return "no strategy of its op produces it"


def pin_placements(name: str, wanted: str | Placements, mesh: Mesh) -> Placements:
    """The placements a pin of `name` asks for (text or a tuple), one per axis of `mesh`."""
    placements = parse_placements(wanted) if isinstance(wanted, str) else tuple(wanted)
    if len(placements) != mesh.ndim:
        raise ShardingError(f"pin of {name!r} has {len(placements)} placements",
                            expected=f"one per mesh axis ({mesh.ndim})",
                            got=format_placements(placements),
                            fix=f"e.g. {','.join(['R'] * mesh.ndim)}")
    return placements


def constrain(gm: fx.GraphModule, table: StrategyTable, mesh: Mesh,
              constraints: Mapping[str, str | Placements]) -> StrategyTable:
    """`table` with each pinned node reduced to its requested strategy."""
    strategies = dict(table.strategies)
    for name, wanted in constraints.items():
        placements = pin_placements(name, wanted, mesh)
        node = _node_for(gm, name, table)
        # A pinned parameter is stored as pinned and read from there (never kept gathered).
        kept = tuple(s for s in strategies[node.name]
                     if s.output == placements and s.gathered is None)
        if not kept:
            raise ShardingError(
                f"{name!r} can't be placed {format_placements(placements)}: "
                f"{_why_impossible(node, placements, mesh)}",
                expected=f"one of {sorted({s.name for s in strategies[node.name]})}",
                got=format_placements(placements),
                fix="pin a dim with an element for every piece, or leave it to the solver")
        strategies[node.name] = kept
    return dataclasses.replace(table, strategies=strategies)
