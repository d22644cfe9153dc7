"""Stage pass: cut an annotated graph into pipeline stages of consecutive blocks.

Reads `autopar_module`, `autopar_role`, `autopar_tensor`, `autopar_flops`, `autopar_bytes`;
returns new GraphModules, one per stage, and leaves the input graph untouched.

**Blocks.** The model's main stack is the ModuleList with the most blocks (`layers.<i>`,
`h.<i>`: the `<list>.<i>` prefix of `autopar_module`). Every op belongs to a *unit*: the
last block that started at or before it in graph order, so the ops before the first block
(embeddings, masks, rotary tables) join block 0 and those after the last (final norm, head,
loss) join the last block. A stage is a run of consecutive units; a cut may only fall where
a block starts.

**Crossing tensors.** The tensors a cut must move are the edge boundary of the ops before
it in the data-flow graph (`networkx.edge_boundary`): each op value made before the cut and
read after it, once however many later ops read it. A value read two stages later passes
through the stage between, as one of its inputs and outputs. State (parameters, buffers,
constants) is not moved: each stage holds what it reads, so a weight two stages read (an
embedding tied to the head) is held by both and its gradient summed over them
(`Stage.shared`); a buffer two stages read is held by both, unchanged (a step that
mutates buffers can't be cut into micro-batches, so it is never pipelined). User inputs
are not moved either: every rank has them, and each stage reads the ones it uses.

**Balance.** `balanced_cuts` chooses the cuts minimising the slowest stage's estimated
time, by dynamic programming over units: best[j][k] = the least max over k stages of units
< j, O(U^2 s) for U units and s stages (a 126-layer model in 8 stages: about 10^5 steps).
The estimate is each op's roofline training time on one device (`formulas.training_compute_time`);
the intra-op plans then refine each stage's time (`autopar.planning.pipeline.plan`).

**A stage's graph** takes the state it reads, its boundary inputs (role "input", `BOUNDARY`
set, in the previous stage's output order), then the user inputs it reads, as the original
placeholders (so its rank program takes state, received tensors, user inputs); it returns
its crossing outputs (its output node `BOUNDARY` too), or for the last stage the original
outputs. Node names and meta are
the original's, so a stage's plan names the model's nodes.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import networkx as nx
import torch
import torch.fx as fx

from autopar.costs import formulas
from autopar.passes.capturing.gradient_path import gradient_path
from autopar.passes.capturing.trace_kernels import priced_kernels
from autopar.values.graph_module import graph_module
from autopar.values.hardware import HardwareProfile
from autopar.values.specs import (
    BLOCK,
    BOUNDARY,
    FLOPS,
    MODULE,
    NAMES,
    ROLE,
    TENSOR,
    TensorSpec,
)


@dataclass(frozen=True)
class Units:
    """The graph's ops grouped into blocks of its main ModuleList (module docstring):
    `unit` maps each op and output node to its block's position, `names` the blocks'
    module paths in order."""

    unit: dict[str, int]
    names: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class Stage:
    """One stage: its graph, the units it runs (`first`..`last`, inclusive), the names of
    its boundary inputs (from the previous stage) and outputs (to the next), and the
    canonical names of the parameters other stages hold too (`shared`: their gradients
    are summed over the stages; shared buffers and constants are only read)."""

    index: int
    module: fx.GraphModule
    first: int
    last: int
    receives: tuple[str, ...]
    sends: tuple[str, ...]
    shared: tuple[str, ...]


def find_units(gm: fx.GraphModule) -> Units:
    """The blocks of `gm`'s main ModuleList and each op's unit (empty without a list)."""
    blocks: dict[str, dict[int, None]] = {}
    for node in gm.graph.nodes:
        match = BLOCK.match(node.meta.get(MODULE, "")) if node.op == "call_function" else None
        if match:
            blocks.setdefault(match["list"], {}).setdefault(int(match["index"]))
    if not blocks:
        return Units({}, ())
    main = max(blocks, key=lambda name: len(blocks[name]))
    unit, names, current = {}, [], 0
    seen: dict[int, int] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        match = BLOCK.match(node.meta.get(MODULE, "")) if node.op == "call_function" else None
        if match and match["list"] == main and int(match["index"]) not in seen:
            seen[int(match["index"])] = len(names)
            names.append(f"{main}.{match['index']}")
            current = len(names) - 1
        unit[node.name] = current
    for node in gm.graph.nodes:  # a getitem goes where its producer does
        if node.target is operator.getitem:
            unit[node.name] = unit[node.args[0].name]
    return Units(unit, tuple(names))


def dataflow(gm: fx.GraphModule) -> nx.DiGraph:
    """The graph's value edges, producer -> consumer, over node names."""
    graph = nx.DiGraph()
    for node in gm.graph.nodes:
        graph.add_node(node.name)
        for user in node.users:
            graph.add_edge(node.name, user.name)
    return graph


def crossing(gm: fx.GraphModule, units: Units, cut: int, flow: nx.DiGraph) -> tuple[str, ...]:
    """The op values made in units < `cut` and read in units >= `cut`, in graph order."""
    before = [n for n, u in units.unit.items() if u < cut]
    producers = {a for a, _ in nx.edge_boundary(flow, before)}
    return tuple(n.name for n in gm.graph.nodes if n.name in producers)


def unit_times(gm: fx.GraphModule, units: Units, hardware: HardwareProfile) -> list[float]:
    """Each unit's roofline training time on one device (forward, and backward on the
    gradient path), the balance estimate."""
    on_path = gradient_path(gm)
    times = [0.0] * units.count
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.name not in units.unit:
            continue
        spec = node.meta.get(TENSOR)
        first = spec[0] if isinstance(spec, tuple) else spec
        dtype = first.dtype if isinstance(first, TensorSpec) else torch.float32
        kernels, nbytes = priced_kernels(node, hardware.device)
        flops, nbytes = float(node.meta.get(FLOPS, 0)), float(nbytes)
        if flops or nbytes:
            times[units.unit[node.name]] += float(formulas.training_compute_time(
                flops, nbytes, dtype, hardware, differentiable=on_path[node.name],
                family=formulas.kernel_family(node.target), kernels=kernels))
    return times


def balanced_cuts(times: list[float] | list[list[float]], stages: int) -> tuple[int, ...]:
    """The first unit of each stage after the first, minimising the slowest stage's sum of
    `times` (module docstring; ties go to the earliest cut): one time per unit, or one list
    per stage (stage k's devices run unit u in `times[k][u]`: stages on devices of
    different speeds, each of which takes the units it runs fastest in its share)."""
    per_stage = [list(t) for t in times] if times and isinstance(times[0], (list, tuple)) \
        else [list(times)] * stages
    count = len(per_stage[0])
    prefixes = []
    for own in per_stage:
        prefix = [0.0]
        for t in own:
            prefix.append(prefix[-1] + t)
        prefixes.append(prefix)
    inf = float("inf")
    best = [[inf] * (stages + 1) for _ in range(count + 1)]
    back = [[0] * (stages + 1) for _ in range(count + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, count - (stages - k) + 1):
            for i in range(k - 1, j):
                value = max(best[i][k - 1], prefixes[k - 1][j] - prefixes[k - 1][i])
                if value < best[j][k]:
                    best[j][k], back[j][k] = value, i
    cuts, j = [], count
    for k in range(stages, 0, -1):
        j = back[j][k]
        cuts.append(j)
    return tuple(reversed(cuts[:-1]))


def split_stages(gm: fx.GraphModule, units: Units, cuts: tuple[int, ...]) -> tuple[Stage, ...]:
    """`gm` as one graph per stage, stage k running units [cuts[k-1], cuts[k])."""
    bounds = (0, *cuts, units.count)
    flow = dataflow(gm)
    sent = [crossing(gm, units, cut, flow) for cut in cuts]
    stage_of = {name: next(k for k in range(len(bounds) - 1) if u < bounds[k + 1])
                for name, u in units.unit.items()}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    readers: dict[str, set[int]] = {}
    for node in placeholders:
        readers[node.name] = {stage_of[u.name] for u in node.users}
    stages = []
    for k in range(len(bounds) - 1):
        receives = sent[k - 1] if k > 0 else ()
        sends = sent[k] if k < len(cuts) else None
        module = _stage_graph(gm, k, stage_of, receives, sends, placeholders, readers)
        shared = tuple(n.meta[NAMES][0] for n in placeholders
                       if n.meta.get(ROLE) == "parameter" and k in readers[n.name]
                       and len(readers[n.name]) > 1)
        stages.append(Stage(k, module, bounds[k], bounds[k + 1] - 1, receives,
                            sends or (), shared))
    return tuple(stages)


def _stage_graph(gm: fx.GraphModule, k: int, stage_of: dict[str, int],
                 receives: tuple[str, ...], sends: tuple[str, ...] | None,
                 placeholders: list[fx.Node], readers: dict[str, set[int]]) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    by_name = {n.name: n for n in gm.graph.nodes}
    read = [node for node in placeholders if k in readers[node.name]]
    for node in read:
        if node.meta.get(ROLE) != "input":
            env[node] = graph.node_copy(node)
    for name in receives:
        original = by_name[name]
        value = graph.placeholder(name)
        value.meta = {**original.meta, ROLE: "input", BOUNDARY: True}
        env[original] = value
    for node in read:
        if node.meta.get(ROLE) == "input":
            env[node] = graph.node_copy(node)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output") or stage_of.get(node.name) != k:
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    if sends is None:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        graph.node_copy(output, lambda n: env[n])
    else:
        out = graph.output(tuple(env[by_name[name]] for name in sends))
        out.meta.update({ROLE: "output", BOUNDARY: True})
    module = graph_module(gm, graph, class_name=f"Stage{k}")
    module.meta.update(gm.meta)
    return module
