"""Which recomputed ops the backward rebuilds: the plan states what the runtime runs.

The runtime (`autopar.runtime.recompute`) rebuilds a recomputed op's outputs when the
backward first unpacks a handle into them, and runs its inputs' collectives again then; an
op whose outputs no backward step reads is never rebuilt, and costs nothing more than the
forward. The problem charges every recomputed op its recomputation (which consumers read
what it wrote is a function of their choices too); `never_rebuilt` names, for chosen
strategies, the recomputed ops the backward never reads, which the plan then lists as not
recomputed, without the recomputation's compute or collectives. Nothing keeps their
outputs either way, so the memory is the same.

A recomputed op X is rebuilt when its own backward reads its output (it saves it, as
softmax and attention do: `ProblemBuild.saves_output`), when an op that is not recomputed
saves X's output as X wrote it (read in X's placement: a converted copy is a tensor of its
own, `edge_costs.held_bytes`), or when a recomputed op or a view that is rebuilt reads it
(a recipe holds a handle into X's output, before any conversion).
"""

from __future__ import annotations

from autopar.passes.problem.build_problem import ProblemBuild
from autopar.passes.problem.edge_costs import EdgeRef
from autopar.passes.strategies.find_strategies import Strategy


def never_rebuilt(build: ProblemBuild, chosen: dict[str, Strategy]) -> frozenset[str]:
    """The decision nodes whose `chosen` strategy recomputes and that the backward never
    rebuilds (module docstring)."""
    readers: dict[str, list[EdgeRef]] = {}
    for ref in build.edges:
        readers.setdefault(ref.producer, []).append(ref)
    rebuilt: set[str] = set()
    for name in reversed(build.nodes):  # graph order: readers before what they read
        strategy = chosen[name]
        if strategy.recompute and (name in build.saves_output or any(
                _reads(ref, strategy, chosen[ref.consumer], rebuilt)
                for ref in readers.get(name, ()))):
            rebuilt.add(name)
    unread = {name for name in build.nodes if chosen[name].recompute and name not in rebuilt}
    # A view carries its base's flag (`edge_costs.strategy_edge_transfers`) whatever its
    # readers do: it runs no op of its own.
    for ref in build.edges:  # in graph order: a view's base before the view
        if ref.consumer_is_view and chosen[ref.consumer].recompute:
            (unread.add if ref.producer in unread else unread.discard)(ref.consumer)
    return frozenset(unread)


def _reads(ref: EdgeRef, src: Strategy, dst: Strategy, rebuilt: set[str]) -> bool:
    """Whether the backward reads, through edge `ref`, the output its recomputed producer
    (`src`) wrote."""
    if ref.consumer_is_view or dst.recompute:
        return ref.consumer in rebuilt
    return ref.consumer_saves and dst.inputs[ref.position] == src.output
