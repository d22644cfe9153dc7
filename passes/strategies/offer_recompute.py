"""Recompute pass: offer every op whose output the backward keeps the choice of recomputing it.

Reads `autopar_role`, `autopar_tensor` and `autopar_bytes`; returns a new `StrategyTable`
in which each eligible op has its strategies twice, the second time with
`Strategy.recompute` set. The solver then weighs, per op (one decision for tied blocks),
the memory of keeping the output against computing it again in the backward
(`build_problem`): recomputing every op of a block but its input is full activation
recomputation, recomputing the cheap ops around the matmuls is the selective kind.

Eligible: ops on the gradient path that write a new tensor (not views, which share their
base's storage) that some op keeps for the backward (`find_saved`), whose result is not a
model output, whose inputs are kept or are op outputs read as written (`recomputable`),
and that draw no random numbers (a
recomputed dropout would draw another mask; ops tagged `nondeterministic_seeded`). A
context-parallel attention strategy (`rules.attention.context_axis`) gets no recomputed
twin: its recomputation would pass the key/value blocks around the ring once more.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from autopar.passes.capturing.find_saved import (
    Saved,
    find_saved,
    kept_outputs,
    storage_base,
    written_base,
)
from autopar.passes.capturing.gradient_path import gradient_path
from autopar.passes.strategies.find_strategies import Strategy, StrategyTable, op_spec
from autopar.rules.attention import RING_TARGETS, context_axis
from autopar.rules.common import draws
from autopar.values.specs import BLOCK, BYTES, module_of


def _seeded(node: fx.Node) -> bool:
    """Whether `node`'s op is tagged `nondeterministic_seeded` (it may draw numbers)."""
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def draws_random_numbers(node: fx.Node) -> bool:
    """Whether `node`'s op draws from the random generator (dropout, rand, ...): tagged
    `nondeterministic_seeded` and called so that it draws (`rules.common.draws`: not an
    attention or a dropout of probability 0, which is deterministic and may be recomputed)."""
    return _seeded(node) and draws(node.target, node.args, node.kwargs)


def recomputable(node: fx.Node, on_path: dict[str, bool],
                 kept: dict[str, frozenset[int]], *, from_block_inputs: bool = False) -> bool:
    """Whether recomputing `node` in the backward can save memory and gives the same value.

    Its output must be kept (`find_saved.kept_outputs`; an op `kept` knows nothing of is
    assumed kept), and every input it would be recomputed from kept anyway (a parameter,
    a user input, or an output some op keeps): recomputing `relu` from a norm's output
    that nothing else keeps would hold that output instead of relu's. With
    `from_block_inputs`, inside a block (a recompute region, `recompute_region`)
    recomputation may also start from, and pass through, tensors nothing keeps, as torch's
    checkpoint recomputes a region from its inputs: an input read as written (the output of
    an op on the gradient path, or a view of it) is kept by the recipe, charged on the edge
    (`edge_costs.held_bytes`), and an output nothing keeps that an op of the block reads as
    written would be kept by that op's recipe. An op tagged random that draws nothing (an
    attention of dropout 0) is recomputable only so: offered op by op, attention made the
    search miss plans under binding budgets it found without (GPT on (2, 2) at 0.32 of its
    single-device peak: no plan within 5 s, one in 3.3 s without), as the block's other
    checkpointed ops did (`searched`).
    The solver weighs what each choice holds against what it frees."""
    region = recompute_region(node)
    in_block = from_block_inputs and region != node.name
    if not (node.op == "call_function" and on_path.get(node.name, False)
            and node.meta.get(BYTES, 0) != 0 and not draws_random_numbers(node)
            and (in_block or not _seeded(node))
            and all(user.op != "output" for user in node.users)):
        return False
    if not (kept.get(node.name, True) or in_block and any(
            recompute_region(reader) == region for reader in _writing_readers(node))):
        return False
    for source in node.all_input_nodes:
        base, index = storage_base(source)
        if base.op == "call_function" and index not in kept.get(base.name, {index}) \
                and not (in_block and _read_as_written(source, base, on_path)):
            return False
    return True


def _writing_readers(node: fx.Node) -> list[fx.Node]:
    """The ops that read `node`'s value and write their own output, directly or through
    views of one input each (`find_saved.written_base`)."""
    base, readers = written_base(node), []
    for user in node.users:
        if user.op != "call_function":
            continue
        if user.meta.get(BYTES, 0) != 0:
            readers.append(user)
        elif base is not None and written_base(user) is base:
            readers.extend(_writing_readers(user))
    return readers


def _read_as_written(source: fx.Node, base: fx.Node, on_path: dict[str, bool]) -> bool:
    """Whether `source` is the output of an op on the gradient path that writes it (not one
    of several outputs), or a view of one (`find_saved.written_base`)."""
    return written_base(source) is base and on_path.get(base.name, False)


def _views_of(node: fx.Node, eligible: set[str]) -> bool:
    """Whether `node` is a view (it moves no bytes) whose storage an eligible op wrote."""
    if node.op != "call_function" or node.meta.get(BYTES, 0) != 0:
        return False
    base, _ = storage_base(node)
    return base is not node and base.name in eligible


def offer_recompute(gm: fx.GraphModule, table: StrategyTable,
                    saved: dict[str, Saved] | None = None) -> StrategyTable:
    """`table` with a recomputed twin of every strategy of every eligible op
    (`recomputable` from block inputs); those eligible only so, and their views, are
    listed in `StrategyTable.checkpointed` (`searched` leaves their twins out). `saved`:
    `find_saved(gm)` when the caller has it."""
    on_path = gradient_path(gm)
    kept = kept_outputs(gm, find_saved(gm) if saved is None else saved)
    # Strategy tuples are shared between identical ops; keep them shared (problem caches).
    doubled: dict[int, tuple[Strategy, ...]] = {}
    strategies = dict(table.strategies)
    eligible = {node.name for node in gm.graph.nodes
                if recomputable(node, on_path, kept, from_block_inputs=True)}
    # Recomputable from kept tensors alone implies from block inputs: test the eligible only.
    plain = {node.name for node in gm.graph.nodes
             if node.name in eligible and recomputable(node, on_path, kept)}
    checkpointed = set()
    for node in gm.graph.nodes:
        # A view of an eligible op's output carries the flag too (build_problem keeps it
        # equal to its base's), so that what reads the view can be held to the same rules.
        if node.name not in strategies or not (
                node.name in eligible or _views_of(node, eligible)):
            continue
        if not (node.name in plain or _views_of(node, plain)):
            checkpointed.add(node.name)
        own = strategies[node.name]
        if id(own) not in doubled:
            # A context-parallel attention would run its ring again: not offered.
            op = op_spec(node) if node.target in RING_TARGETS else None
            doubled[id(own)] = own + tuple(
                dataclasses.replace(s, recompute=True) for s in own
                if op is None or context_axis(op, s.inputs) is None)
        strategies[node.name] = doubled[id(own)]
    return dataclasses.replace(table, strategies=strategies,
                               checkpointed=frozenset(checkpointed))


def searched(table: StrategyTable) -> StrategyTable:
    """`table` as the solver searches it: the `checkpointed` ops kept, not recomputed.

    Checkpointing a block from its inputs is a hand strategy's fixed choice ("full",
    "selective": `restrict`). Offered to the solver's search op by op it makes its
    relaxation of the recipes' usages so loose that, under budgets that bind, the search
    misses plans it finds without them (GPT and BERT on (2, 2) at a third of their
    single-device peak)."""
    strategies = dict(table.strategies)
    kept: dict[int, tuple[Strategy, ...]] = {}
    for name in table.checkpointed:
        own = strategies[name]
        if id(own) not in kept:
            kept[id(own)] = tuple(s for s in own if not s.recompute)
        strategies[name] = kept[id(own)]
    return dataclasses.replace(table, strategies=strategies, checkpointed=frozenset())


def recompute_region(node: fx.Node) -> str:
    """The block (`<list>.<i>` of a ModuleList) a node belongs to, else the node itself.
    Recomputing an op may recompute the ops it reads from in the same region only, so a
    backward rebuilds one region at a time, from tensors that were kept."""
    match = BLOCK.match(module_of(node))
    return f"{match['list']}.{match['index']}" if match else node.name
