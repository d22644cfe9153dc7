"""Compression pass: offer trained parameters their collectives compressed.

Reads `autopar_role` and `autopar_tensor`; returns a new `StrategyTable` in which a trained
parameter's strategy has a twin with `Strategy.compression` set for each allowed
compression that makes it move fewer bytes (`autopar.values.compression`):

- "reduce" (bf16-reduce): every strategy of an fp32 parameter (its gradient's reductions);
- "gather" (int8-gather): a strategy that stores the parameter sharded (its gathers);
- "secondary" (hpz): a strategy that gathers it at each use (ZeRO-3) from a piece stored
  sharded over two axes or more;
- "low-rank" (PowerSGD): a strategy that replicates it over some axis (its gradient's
  all-reduce) where its piece is a matrix PowerSGD compresses;
- several of the first three together (`values.compression.combined`: "int8-gather+hpz",
  "bf16-reduce+int8-gather+hpz"), where each of them applies.

The edge costs charge the twin's collectives the compressed bytes
(`autopar.costs.compression`) and its node the encoding and decoding
(`op_costs.compression_time`); the runtime runs them compressed (`Redistribution.
compression`). Nothing is offered on a mesh of one device, where nothing is moved, nor to
a parameter cut by an axis's shares (its collectives run exact).
"""

from __future__ import annotations

import dataclasses
import itertools

import torch.fx as fx

from autopar.passes.capturing.gradient_path import trained
from autopar.passes.strategies.find_strategies import Strategy, StrategyTable
from autopar.values.compression import COMBINABLE, Compression, combined
from autopar.values.placement import Replicate, Shard, Shares, cut_by_shares, local_shape
from autopar.values.specs import ROLE, TENSOR, TensorSpec


def offer_compression(gm: fx.GraphModule, table: StrategyTable,
                      compressions: tuple[Compression, ...],
                      mesh_shape: tuple[int, ...], shares: Shares = None) -> StrategyTable:
    """`table` with the twins of every trained parameter's strategies that a compression of
    `compressions` applies to, on a mesh of `mesh_shape` cutting by `shares`."""
    twins: dict[tuple, tuple[Strategy, ...]] = {}  # shared tuples stay shared (build_problem)
    strategies = dict(table.strategies)
    for node in gm.graph.nodes:
        if node.op != "placeholder" or node.meta.get(ROLE) != "parameter" \
                or not trained(node) or node.name not in strategies:
            continue
        spec: TensorSpec = node.meta[TENSOR]
        options = strategies[node.name]
        key = (id(options), spec.shape, spec.dtype)
        if key not in twins:
            twins[key] = options + tuple(
                dataclasses.replace(s, compression=c.name) for c in _with_combinations(compressions)
                for s in options if _applies(c, spec, s, mesh_shape)
                and not cut_by_shares(s.output, shares))
        strategies[node.name] = twins[key]
    return dataclasses.replace(table, strategies=strategies)


def _with_combinations(compressions: tuple[Compression, ...]) -> tuple[Compression, ...]:
    """`compressions`, and every combination of two or more of their combinable ones."""
    singles = [c for c in compressions if c.kind in COMBINABLE]
    return compressions + tuple(
        combined(parts) for size in range(2, len(singles) + 1)
        for parts in itertools.combinations(singles, size))


def _applies(compression: Compression, spec: TensorSpec, strategy: Strategy,
             mesh_shape: tuple[int, ...]) -> bool:
    """Whether `compression` makes the parameter move fewer bytes under `strategy` (a
    combination: each of its parts does)."""
    if compression.parts:
        return all(_applies(part, spec, strategy, mesh_shape) for part in compression.parts)
    axes = [p for p, n in zip(strategy.output, mesh_shape) if n > 1]
    if compression.kind == "gather":
        shape, moved = spec.shape, any(isinstance(p, Shard) for p in axes)
    elif compression.kind == "secondary":
        shape = spec.shape
        moved = strategy.gathered is None and sum(isinstance(p, Shard) for p in axes) >= 2
    elif compression.kind == "low-rank":
        shape = local_shape(spec.shape, strategy.output, mesh_shape)
        moved = any(isinstance(p, Replicate) for p in axes)
    else:
        shape, moved = spec.shape, bool(axes)
    return moved and compression.applies_to(shape, spec.dtype)
