"""Compression pass: offer trained parameters their gradients reduced compressed.

Reads `autopar_role` and `autopar_tensor`; returns a new `StrategyTable` in which every
strategy of a trained parameter whose gradient one of the allowed compressions makes
smaller (`Compression.applies_to`: bf16-reduce for an fp32 gradient) has a twin with
`Strategy.compression` set, one per such compression. The edge costs charge the twin's
backward reductions the compressed bytes (`edge_costs.compressed`) and its node the casts
(`op_costs.compression_time`); the runtime reduces in the compressed dtype
(`Redistribution.reduce_dtype`). Nothing is offered on a mesh of one device, where no
gradient is reduced.
"""

from __future__ import annotations

import dataclasses

import torch.fx as fx

from autopar.passes.capturing.gradient_path import trained
from autopar.passes.strategies.find_strategies import Strategy, StrategyTable
from autopar.values.compression import Compression
from autopar.values.specs import ROLE, TENSOR


def offer_compression(gm: fx.GraphModule, table: StrategyTable,
                      compressions: tuple[Compression, ...]) -> StrategyTable:
    """`table` with a twin of every trained parameter strategy per compression that makes
    its gradient smaller."""
    twins: dict[tuple, tuple[Strategy, ...]] = {}  # shared tuples stay shared (build_problem)
    strategies = dict(table.strategies)
    for node in gm.graph.nodes:
        if node.op != "placeholder" or node.meta.get(ROLE) != "parameter" \
                or not trained(node) or node.name not in strategies:
            continue
        useful = tuple(c.name for c in compressions if c.applies_to(node.meta[TENSOR].dtype))
        options = strategies[node.name]
        key = (id(options), useful)
        if useful and key not in twins:
            twins[key] = options + tuple(dataclasses.replace(s, compression=name)
                                         for name in useful for s in options)
        strategies[node.name] = twins.get(key, options)
    return dataclasses.replace(table, strategies=strategies)
