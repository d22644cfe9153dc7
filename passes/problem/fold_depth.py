"""Fold pass: a graph of many identical blocks as one with four of them, the third standing
for the rest.

Reads `autopar_module`, `autopar_names`, `autopar_role`, `autopar_tensor`, `autopar_flops`
and `autopar_bytes`; returns a new GraphModule with `autopar_fold` (`specs.Fold`) in its
meta, or the graph itself when nothing folds. The input graph is left untouched.

Planning work grows with the graph's nodes: the strategy table, the problem (node costs,
memory, edge matrices), the saved tensors, the extracted plan. With `fold_layers` the
solver ties identical blocks into one decision anyway, so an 80-block model's plan is the
plan of one block, repeated. This pass makes the work match: a run of consecutive blocks
`s..e` of the main ModuleList that are *alike* is kept as the blocks `s`, `s+1`, `s+2` and
`e`, block `s+2` (the representative) standing for the blocks `s+2..e-1`; block `e`, which
read block `e-1`, reads the representative. The problem pass weighs each of the
representative's nodes by the `r = e - s - 2` blocks it stands for:

- compute and the collectives into it count r times: the edges into block `s+2` from block
  `s+1` stand for the `r` edges between consecutive blocks of `s+1..e-1`, which join tied
  blocks (the same choices) as `s+1 -> s+2` does; those into block `e` for the one from
  block `e-1`;
- memory held to the end of the forward (stored state, kept activations) counts r times,
  memory freed within the block once. The peak is then the unfolded graph's: inside block
  `e` and after it the same tensors are live, and inside an earlier block the unfolded
  graph holds no more than inside block `e` at the same position.

So the folded problem's cost and peak of any tied choice are those of the unfolded
problem, and its plan, expanded by `Fold.copies` (`extract_plan`), is the unfolded plan.

**Alike.** Block `j` is alike block `j-1` when, position by position in graph order, their
ops have the same target, tensor specs, FLOPs, bytes and module path below the block, and
read the same things: their own block's nodes at the same positions, the previous block's
at the same positions (the residual stream), the same nodes outside the blocks (masks,
rotary tables, inputs) or their own parameters at the same positions (same shapes and
names below the block). The blocks `s+2..e-1`, which the folded graph keeps one of, may be
read only by their own block and the next one. A run of five or more alike blocks folds;
`keep` names nodes (by node or tensor name) whose strategies may differ from their
block's neighbours' (constrained tensors), which stops the fold when they lie in blocks `s+1..e-1`.

Cost: one pass over the graph's nodes, comparing each block's with the one before it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch.fx as fx

from autopar.values.graph_module import graph_module
from autopar.values.specs import (
    BLOCK,
    BYTES,
    FLOPS,
    FOLD,
    MODULE,
    NAMES,
    ROLE,
    TENSOR,
    Fold,
    module_of,
)

# The fewest alike blocks folded: four are kept, so five remove one.
MIN_RUN = 5
_STATE = ("parameter", "buffer", "constant")


@dataclass(eq=False)
class _Block:
    """One block's nodes in graph order: its ops (with their getitems) and its state."""

    prefix: str
    ops: list[fx.Node]
    state: list[fx.Node]

    @property
    def nodes(self) -> tuple[fx.Node, ...]:
        return (*self.ops, *self.state)


def fold_depth(gm: fx.GraphModule, keep: frozenset[str] = frozenset()) -> fx.GraphModule:
    """`gm` with its longest run of alike blocks folded (module docstring), or `gm` itself
    when no run of `MIN_RUN` alike blocks may fold."""
    blocks = _main_blocks(gm)
    if len(blocks) < MIN_RUN:
        return gm
    where = {n: k for k, block in enumerate(blocks) for n in block.nodes}
    position = {n: (kind, i) for block in blocks
                for kind, nodes in (("op", block.ops), ("state", block.state))
                for i, n in enumerate(nodes)}
    alike = [False] + [_alike(blocks[k], blocks[k - 1], where, position, k)
                       for k in range(1, len(blocks))]
    start, end = _longest_run(alike)
    if end - start + 1 < MIN_RUN:
        return gm
    if any(n.name in keep or not keep.isdisjoint(n.meta.get(NAMES, ()))
           for block in blocks[start + 1:end] for n in block.nodes):
        return gm  # a constrained node may make its block's strategies differ from the next's
    if any(where.get(user) not in (k, k + 1) for k in range(start + 2, end)
           for node in blocks[k].nodes for user in node.users):
        return gm  # read from beyond the next block: each copy is read on its own
    folded_away = {n for block in blocks[start + 3:end] for n in block.nodes}
    return _folded(gm, blocks[start + 1], blocks[start + 2:end], folded_away)


def _main_blocks(gm: fx.GraphModule) -> list[_Block]:
    """The blocks of the ModuleList with the most blocks in `gm`, consecutive indices only
    (a stage's graph holds a range of them), in graph order."""
    found: dict[str, dict[int, _Block]] = {}

    def block_of(prefix_source: str) -> _Block | None:
        match = BLOCK.match(prefix_source)
        if match is None:
            return None
        prefix = f"{match['list']}.{match['index']}"
        by_index = found.setdefault(match["list"], {})
        return by_index.setdefault(int(match["index"]), _Block(prefix, [], []))

    owner: dict[fx.Node, _Block] = {}
    for node in gm.graph.nodes:
        block = None
        if node.op == "placeholder" and node.meta.get(ROLE) in _STATE:
            block = block_of(module_of(node) + ".") if node.meta.get(NAMES) else None
            if block is not None:
                block.state.append(node)
        elif node.op == "call_function":
            source = node.args[0] if node.target is operator.getitem else None
            block = owner.get(source) if isinstance(source, fx.Node) else None
            block = block or block_of(node.meta.get(MODULE, ""))
            if block is not None:
                block.ops.append(node)
        if block is not None:
            owner[node] = block
    if not found:
        return []
    by_index = max(found.values(), key=lambda blocks: sum(bool(b.ops) for b in blocks.values()))
    indices = sorted(i for i, block in by_index.items() if block.ops)
    if not indices or indices != list(range(indices[0], indices[0] + len(indices))):
        return []
    return [by_index[i] for i in indices]


def _alike(block: _Block, before: _Block, where: dict[fx.Node, int],
           position: dict[fx.Node, tuple[str, int]], k: int) -> bool:
    """Whether block `k` is alike block `k - 1` (module docstring); `where` holds each
    block node's block, `position` its place in its block."""
    if len(block.ops) != len(before.ops) or len(block.state) != len(before.state):
        return False
    for mine, theirs in zip(block.state, before.state):
        if (_below(mine.meta[NAMES][0], block.prefix), mine.meta.get(TENSOR)) != \
                (_below(theirs.meta[NAMES][0], before.prefix), theirs.meta.get(TENSOR)):
            return False

    def reads(node: fx.Node, at: int):
        def ref(value: fx.Node):
            home = where.get(value)
            if home == at:
                return ("own", *position[value])
            if home == at - 1 and value.op != "placeholder":
                return ("previous", *position[value])
            return ("outside", value.name)
        return fx.node.map_arg((node.args, node.kwargs), ref)

    for mine, theirs in zip(block.ops, before.ops):
        if mine.target != theirs.target or any(
                mine.meta.get(key) != theirs.meta.get(key) for key in (TENSOR, FLOPS, BYTES)):
            return False
        if _below(mine.meta.get(MODULE, ""), block.prefix) != \
                _below(theirs.meta.get(MODULE, ""), before.prefix):
            return False
        if reads(mine, k) != reads(theirs, k - 1):
            return False
    return True


def _below(path: str, prefix: str) -> str:
    """`path` below the block `prefix` (the whole path when outside it)."""
    return path[len(prefix):] if path == prefix or path.startswith(prefix + ".") else path


def _longest_run(alike: list[bool]) -> tuple[int, int]:
    """(first, last) block of the longest run in which every block after the first is
    alike the one before it."""
    best, start = (0, 0), 0
    for k, same in enumerate(alike):
        if not same:
            start = k
        if k - start > best[1] - best[0]:
            best = (start, k)
    return best


def _folded(gm: fx.GraphModule, before: _Block, stands_for: list[_Block],
            folded_away: set[fx.Node]) -> fx.GraphModule:
    """`gm` without the nodes `folded_away`: `stands_for[0]`, the representative, in place
    of the blocks `stands_for` (block `before` precedes them), the block after them reading
    it where it read the last of them, and the `Fold` in gm's meta."""
    representative, last = stands_for[0], stands_for[-1]
    # The last block's readers read the representative's node at the same position.
    env = dict(zip(last.nodes, representative.nodes))
    graph, copied = fx.Graph(), {}
    for node in gm.graph.nodes:
        if node in folded_away:
            continue
        copied[node] = graph.node_copy(node, lambda value: copied[env.get(value, value)])
    members = [b.nodes for b in stands_for]
    copies = {nodes[0].name: tuple(n.name for n in nodes) for nodes in zip(*members)}
    modules = {nodes[0].name: tuple(module_of(n) for n in nodes) for nodes in zip(*members)}
    previous = {mine.name: theirs.name for mine, theirs in zip(
        before.nodes, representative.nodes)}
    folded = graph_module(gm, graph)
    folded.meta = {**gm.meta, FOLD: Fold(copies, modules, previous,
                                         {n.name: i for i, n in enumerate(gm.graph.nodes)})}
    return folded
