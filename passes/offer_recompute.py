"""Recompute pass: offer every op whose output the backward keeps the choice of recomputing it.

Reads `autopar_role`, `autopar_tensor` and `autopar_bytes`; returns a new `StrategyTable`
in which each eligible op has its strategies twice, the second time with
`Strategy.recompute` set. The solver then weighs, per op (one decision for tied blocks),
the memory of keeping the output against computing it again in the backward
(`build_problem`): recomputing every op of a block but its input is full activation
recomputation, recomputing the cheap ops around the matmuls is the selective kind.

Eligible: ops on the gradient path that write a new tensor (not views, which share their
base's storage), whose result is not a model output, and that draw no random numbers (a
recomputed dropout would draw another mask; ops tagged `nondeterministic_seeded`).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from autopar.passes.build_problem import gradient_path
from autopar.passes.find_strategies import Strategy, StrategyTable
from autopar.specs import BYTES


def draws_random_numbers(node: fx.Node) -> bool:
    """Whether `node`'s op is seeded from the random generator (dropout, rand, ...)."""
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def recomputable(node: fx.Node, on_path: dict[str, bool]) -> bool:
    """Whether recomputing `node` in the backward can save memory and gives the same value."""
    return (node.op == "call_function" and node.name in on_path and on_path[node.name]
            and node.meta.get(BYTES, 0) != 0 and not draws_random_numbers(node)
            and all(user.op != "output" for user in node.users))


def offer_recompute(gm: fx.GraphModule, table: StrategyTable) -> StrategyTable:
    """`table` with a recomputed twin of every strategy of every eligible op."""
    on_path = gradient_path(gm)
    # Strategy tuples are shared between identical ops; keep them shared (problem caches).
    doubled: dict[int, tuple[Strategy, ...]] = {}
    strategies = dict(table.strategies)
    for node in gm.graph.nodes:
        if node.name not in strategies or not recomputable(node, on_path):
            continue
        own = strategies[node.name]
        if id(own) not in doubled:
            doubled[id(own)] = own + tuple(dataclasses.replace(s, recompute=True) for s in own)
        strategies[node.name] = doubled[id(own)]
    return dataclasses.replace(table, strategies=strategies)
