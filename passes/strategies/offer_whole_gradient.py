"""ZeRO-1 pass: offer parameters kept gathered the choice of a whole, accumulated gradient.

Reads nothing from the graph; returns a new `StrategyTable` in which every parameter
strategy kept gathered (ZeRO-2, `Strategy.gathered`) has a twin with
`Strategy.whole_gradient` set (ZeRO-1). Only a step of several micro-batches tells them
apart: ZeRO-2 reduce-scatters each micro-batch's gradient into the shard and gathers the
parameter for each micro-batch; ZeRO-1 gathers it once, accumulates the whole gradient over
the micro-batches and reduce-scatters it once, holding a whole gradient instead of a shard.
With one micro-batch ZeRO-1 moves the same bytes and holds more, so the planner offers it
only for several (`autopar.planning.graph.plan_graph`).
"""

from __future__ import annotations

import dataclasses

from autopar.passes.strategies.find_strategies import Strategy, StrategyTable


def offer_whole_gradient(table: StrategyTable) -> StrategyTable:
    """`table` with a ZeRO-1 twin of every kept-gathered parameter strategy."""
    doubled: dict[int, tuple[Strategy, ...]] = {}  # shared tuples stay shared (build_problem)
    strategies = {}
    for name, options in table.strategies.items():
        if not any(s.gathered is not None for s in options):
            strategies[name] = options
            continue
        if id(options) not in doubled:
            doubled[id(options)] = options + tuple(
                dataclasses.replace(s, whole_gradient=True) for s in options
                if s.gathered is not None)
        strategies[name] = doubled[id(options)]
    return dataclasses.replace(table, strategies=strategies)
