"""Problem pass: turn the strategy table into a `ShardingProblem` of seconds and bytes.

Reads `autopar_role`, `autopar_names`, `autopar_module`, `autopar_tensor`, `autopar_flops`
and `autopar_bytes`. Writes nothing into the graph; returns a `ProblemBuild` that keeps the
map from problem indices back to graph nodes and tensors.

- Node cost of a strategy: forward plus backward compute of one rank (roofline), the work
  divided over the axes where the strategy splits it (`formulas.compute_divisor`). Ops off the
  gradient path (masks, position tables) pay no backward. A context-parallel attention
  adds the part of its ring's transfers that its compute does not hide (`op_time`).
- Edge cost: the forward collectives that turn the producer's placement into the one the
  consumer's strategy wants, plus the backward collectives derived in `autopar.costs.formulas`. A
  parameter's gradient reduction that the runtime overlaps with the rest of the backward
  (`background_reductions`), and a parameter's gather it starts one use ahead
  (`background_gathers`), count at the `Background` fractions of their time (the caller's
  estimate of the part left exposed; see `autopar.planning.graph.plan_table`). The edges' costs are
  `passes/problem/edge_costs.py`'s: an edge's matrix is computed once per distinct signature of its
  pairs of strategies, and kept, apart from the charges, for the next problem built with
  the same `EdgeCache`.
- Memory per device: parameters with their gradient, master copy and optimizer states
  (`autopar.costs.optimizer_state`; the three where the parameter is stored, the parameter
  itself also gathered, once per use that saves it, when kept gathered: ZeRO-2), buffers,
  user inputs, and what autograd keeps for the backward (`find_saved`): the outputs some
  op saves (views share their base's storage and add nothing) and the tensors ops save
  inside (statistics, log-softmax), split as the op's work is. Stored tensors live for
  the whole step, kept activations from their op to the end of the forward, others until
  their last use. A recomputed op keeps no output, except in the first block of tied
  blocks: there its outputs stand for the one block the backward recomputes at a time.
- Micro-batches: with M of them the graph is one micro-batch's, and a step runs it M
  times: compute and collectives count M times, except those run once per step
  (`once_per_step`: gradient all-reduces of replicated parameters, deferred to the last
  micro-batch as DDP's `no_sync` does, and a ZeRO-1 parameter's gather and scatter).
  Memory is one micro-batch's activations; a ZeRO-1 parameter holds its gathered copy and
  its whole gradient for the step, one of each per use.
- Ties: the blocks of a `ModuleList` (module paths `<list>.<i>...`) whose nodes and
  strategies match are tied node by node, so identical transformer blocks are one
  decision (the plan is uniform across them).
- Folded graphs (`passes/problem/fold_depth.py`): a node standing for r nodes of the unfolded
  graph counts r times in compute, in the edges into it and, when held to the end of the
  forward, in memory; the problem is the unfolded one's, tied.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch.fx as fx

from autopar.costs import formulas
from autopar.costs.optimizer_state import ADAMW, OptimizerState
from autopar.costs.ring import Ring, ring_of
from autopar.passes.capturing.find_saved import Saved, find_saved, kept_outputs
from autopar.passes.capturing.gradient_path import (
    gradient_path,
    is_differentiable,
    passes_gradient,
    tensor_outputs,
)
from autopar.passes.problem.edge_costs import Background, EdgeCache, EdgeRef
from autopar.passes.strategies.find_strategies import STORED_ROLES, Strategy, StrategyTable, op_spec
from autopar.passes.strategies.offer_recompute import recompute_region
from autopar.rules.attention import RING_TARGETS
from autopar.solver.problem import ShardingProblem
from autopar.values.mesh import Mesh
from autopar.values.specs import BLOCK, BYTES, FLOPS, FOLD, ROLE, TensorSpec, module_of


@dataclass(frozen=True, eq=False)
class ProblemBuild:
    """The problem with the bookkeeping that maps its indices back to the graph."""

    problem: ShardingProblem
    nodes: tuple[str, ...]
    edges: tuple[EdgeRef, ...]
    strategies: tuple[tuple[Strategy, ...], ...]
    requires_grad: dict[str, bool]
    mesh: Mesh
    optimizer: OptimizerState
    microbatches: int
    # Per node: how many nodes of the unfolded graph it stands for (`Fold.repeats`), and
    # how many times its memory counts (as many when held to the end of the forward,
    # else once).
    repeats: tuple[int, ...]
    held_repeats: tuple[int, ...]


def edge_ref(by_name: dict[str, fx.Node], on_path: dict[str, bool],
             inputs: tuple[tuple[str, TensorSpec], ...], consumer: str,
             position: int, saved_by: dict[str, Saved] | None = None) -> EdgeRef:
    """The edge into tensor input `position` of `consumer`, whose tensor inputs are `inputs`
    (`find_strategies.tensor_inputs`); `by_name` maps node names to graph nodes. A parameter
    is saved by its consumer for the backward when some other input of the consumer carries
    a gradient (a linear's weight when its input does). `saved_by` (`find_saved`) says which
    inputs ops keep; without it, or for an op it does not know, every input is kept."""
    producer, spec = inputs[position]
    saved = by_name[producer].meta.get(ROLE) == "parameter" and any(
        on_path[name] and is_differentiable(other)
        for i, (name, other) in enumerate(inputs) if i != position and name != producer)
    requires_grad = (on_path[producer] and is_differentiable(spec)
                     and passes_gradient(by_name[consumer]))
    entry = (saved_by or {}).get(consumer)
    node = by_name[consumer]
    return EdgeRef(producer, consumer, position, spec, requires_grad, saved,
                   recompute_region(by_name[producer]) == recompute_region(node),
                   by_name[producer].meta.get(ROLE) == "parameter",
                   consumer_is_view=node.op == "call_function" and node.meta.get(BYTES, 0) == 0,
                   consumer_saves=entry is None or position in entry.inputs)


def op_compute_time(node: fx.Node, strategy: Strategy, mesh: Mesh, *, differentiable: bool,
                    size=lambda value: value):
    """Seconds one rank computes `node` under `strategy` (forward, backward, recompute):
    the node's FLOPs and bytes, through `size` (a number for the solve, the sympy formula
    for the plan), divided over the axes the strategy splits the work on. 0 for views and
    metadata ops, which launch no kernel, and for nodes that are not ops."""
    if node.op != "call_function":
        return 0
    flops, nbytes = size(node.meta.get(FLOPS, 0)), size(node.meta.get(BYTES, 0))
    if flops == 0 and nbytes == 0:
        return 0
    divisor = formulas.compute_divisor(strategy.inputs, strategy.output, mesh.shape)
    return formulas.training_compute_time(flops / divisor, nbytes / divisor,
                                          tensor_outputs(node)[0].dtype, mesh.hardware,
                                          differentiable=differentiable,
                                          recompute=strategy.recompute)


def op_ring(node: fx.Node, strategy: Strategy, mesh: Mesh, size=lambda value: value
            ) -> Ring | None:
    """The ring a context-parallel attention `node` runs under `strategy`, else None, with
    its tensors' bytes through `size` (as in `op_compute_time`)."""
    if node.op != "call_function" or node.target not in RING_TARGETS:
        return None
    return ring_of(op_spec(node), strategy.inputs, strategy.output, mesh.shape,
                   nbytes=lambda spec: size(spec.sym_nbytes))


def op_time(node: fx.Node, strategy: Strategy, mesh: Mesh, *, differentiable: bool,
            size=lambda value: value):
    """`op_compute_time`, plus for a context-parallel attention its ring's extra kernel
    launches and the part of its transfers its compute does not hide
    (`autopar.costs.ring`)."""
    both = op_compute_time(node, strategy, mesh, differentiable=differentiable, size=size)
    ring = op_ring(node, strategy, mesh, size)
    if ring is None:
        return both
    forward = op_compute_time(node, strategy, mesh, differentiable=False, size=size)
    return (both + ring.launch_seconds(mesh.hardware, differentiable=differentiable)
            + ring.exposed_seconds(forward, both - forward, mesh,
                                   differentiable=differentiable))


def stored_parameter_bytes(spec: TensorSpec, placements, mesh_shape: tuple[int, ...],
                           optimizer: OptimizerState) -> tuple[float, float]:
    """(bytes of a parameter's stored piece, which its gradient has too; bytes of its
    master copy and optimizer states) on one rank, stored as `placements`."""
    stored = formulas.local_bytes(spec.nbytes, placements, mesh_shape)
    elements = formulas.local_bytes(spec.numel, placements, mesh_shape)
    return stored, elements * optimizer.element_bytes(spec.dtype)


def parameter_bytes(spec: TensorSpec, strategy: Strategy, mesh: Mesh, optimizer: OptimizerState,
                    saving_uses: int, uses: int) -> float:
    """Bytes one rank holds for a parameter: its stored piece, gradient, master copy and
    optimizer states (all stored as `strategy.output`), plus, when it is kept gathered,
    one gathered copy for each use that saves it for the backward (ZeRO-2), or a gathered
    copy and its whole gradient for each of its `uses` (ZeRO-1, kept for the step)."""
    stored, states = stored_parameter_bytes(spec, strategy.output, mesh.shape, optimizer)
    total = 2 * stored + states
    if strategy.gathered is not None:
        copies = 2 * uses if strategy.whole_gradient else saving_uses
        total += copies * formulas.local_bytes(spec.nbytes, strategy.gathered, mesh.shape)
    return total


def _number(value, hints) -> float:
    return float(value.subs(hints)) if hasattr(value, "subs") else float(value)


class _Builder:
    def __init__(self, gm: fx.GraphModule, table: StrategyTable, mesh: Mesh,
                 optimizer: OptimizerState, hints: dict, charges: Background,
                 saved: dict[str, Saved], microbatches: int, in_flight: int = 1,
                 edge_cache: EdgeCache | None = None) -> None:
        self.gm, self.table, self.mesh, self.hints = gm, table, mesh, hints
        self.optimizer, self.charges = optimizer, charges
        self.microbatches, self.in_flight = microbatches, in_flight
        self.by_name = {n.name: n for n in gm.graph.nodes}
        self.order = [n.name for n in gm.graph.nodes if n.name in table.strategies]
        self.index = {name: i for i, name in enumerate(self.order)}
        self.on_path = gradient_path(gm)
        self.saved = saved
        self.kept = kept_outputs(gm, saved)
        self.fold = gm.meta.get(FOLD)
        self.repeats = [self.fold.repeats(name) if self.fold else 1 for name in self.order]
        self.saving_uses: dict[str, int] = {}  # parameter -> uses that save it
        self.uses: dict[str, int] = {}  # parameter -> uses
        self.edge_cache = edge_cache if edge_cache is not None else EdgeCache(mesh)
        self.matrices: dict[int, np.ndarray] = {}  # id(EdgeSecondsTable) -> charged matrix
        self.arrays: dict[tuple, np.ndarray] = {}  # (id(strategies), what a node reads) -> costs

    def node_costs(self, node: fx.Node, strategies: tuple[Strategy, ...]) -> np.ndarray:
        """`node_cost` of each of `strategies`, computed once for the nodes that have them
        and are alike in all it reads (the nodes of repeated blocks)."""
        if node.op != "call_function":
            reads: tuple = ("no op",)
        else:
            flops, nbytes = (_number(node.meta.get(key, 0), self.hints) for key in (FLOPS, BYTES))
            reads = ("op", flops, nbytes, tensor_outputs(node)[0].dtype if flops or nbytes
                     else None, self.on_path[node.name])
        return self._array((id(strategies), "cost", reads),
                           lambda: [self.node_cost(node, s) for s in strategies])

    def node_usages(self, node: fx.Node, strategies: tuple[Strategy, ...], *,
                    first_of_tie: bool) -> np.ndarray:
        """`node_usage` of each of `strategies`, computed once for the nodes that have them
        and are alike in all it reads."""
        name = node.name
        reads = (node.meta.get(ROLE), node.op, tensor_outputs(node),
                 self.saving_uses.get(name, 0), self.uses.get(name, 0),
                 _number(node.meta.get(BYTES, 0), self.hints) == 0, self.saved.get(name),
                 self.kept.get(name), self.on_path.get(name), first_of_tie)
        return self._array((id(strategies), "usage", reads), lambda: [
            self.node_usage(node, s, first_of_tie=first_of_tie) for s in strategies])

    def _array(self, key: tuple, values) -> np.ndarray:
        found = self.arrays.get(key)
        if found is None:
            found = self.arrays[key] = np.array(values(), dtype=float)
        return found

    def node_cost(self, node: fx.Node, strategy: Strategy) -> float:
        return self.microbatches * float(op_time(
            node, strategy, self.mesh, differentiable=self.on_path[node.name],
            size=lambda value: _number(value, self.hints)))

    def node_usage(self, node: fx.Node, strategy: Strategy, *, first_of_tie: bool) -> float:
        """Bytes the node holds while live: a parameter with its gradient and optimizer
        state, once; an activation (a user or boundary input, or an op on the gradient
        path) once per micro-batch in flight."""
        usage = self._usage(node, strategy, first_of_tie=first_of_tie)
        per_microbatch = node.meta.get(ROLE) == "input" or (
            node.op == "call_function" and self.on_path[node.name])
        return usage * self.in_flight if per_microbatch else usage

    def _usage(self, node: fx.Node, strategy: Strategy, *, first_of_tie: bool) -> float:
        role = node.meta.get(ROLE)
        if role == "parameter":
            return float(parameter_bytes(tensor_outputs(node)[0], strategy, self.mesh,
                                         self.optimizer, self.saving_uses.get(node.name, 0),
                                         self.uses.get(node.name, 0)))
        held = sum(formulas.local_bytes(s.nbytes, strategy.output, self.mesh.shape)
                   for s in tensor_outputs(node)) if node.op != "output" else 0
        if role in STORED_ROLES or role == "input":
            return float(held)
        if _number(node.meta.get(BYTES, 0), self.hints) == 0:
            return 0.0  # a view shares its base's storage
        entry = self.saved.get(node.name)
        if entry is None:  # unknown to find_saved: its output is kept
            return 0.0 if strategy.recompute and not first_of_tie else float(held)
        kept = self.kept[node.name]
        outputs = 0 if strategy.recompute and not first_of_tie else sum(
            formulas.local_bytes(spec.nbytes, strategy.output, self.mesh.shape)
            for k, spec in enumerate(tensor_outputs(node)) if k in kept)
        divisor = formulas.compute_divisor(strategy.inputs, strategy.output, self.mesh.shape)
        return float(outputs + entry.internal_bytes / divisor)

    def interval(self, node: fx.Node) -> tuple[int, int]:
        end = len(self.order)
        if node.op == "placeholder":
            return (0, end)
        start = self.index[node.name]
        entry = self.saved.get(node.name)
        kept_nothing = entry is not None and not self.kept[node.name] \
            and entry.internal_bytes == 0
        if (self.on_path[node.name] and not kept_nothing) or node.op == "output":
            return (start, end)
        users = [self.index[u] for u in self._decision_users(node)]
        return (start, max(users, default=start) + 1)

    def _decision_users(self, node: fx.Node):
        for user in node.users:
            if user.name in self.index:
                yield user.name
            else:  # getitem and other pass-through nodes
                yield from self._decision_users(user)

    def edge_matrix(self, ref: EdgeRef) -> np.ndarray:
        table = self.edge_cache.seconds(ref, self.table.strategies[ref.producer],
                                        self.table.strategies[ref.consumer], self.microbatches)
        # Edges of tied blocks share their table, and then one charged matrix.
        matrix = self.matrices.get(id(table))
        if matrix is None:
            matrix = self.matrices[id(table)] = table.charged(self.charges)
        return matrix

    def ties(self, strategies) -> tuple[tuple[int, ...], ...]:
        """Node by node, the blocks of each ModuleList with the same ops and strategies."""
        blocks: dict[str, dict[int, list[int]]] = {}
        for i, name in enumerate(self.order):
            match = BLOCK.match(module_of(self.by_name[name]))
            if match:
                blocks.setdefault(match["list"], {}).setdefault(int(match["index"]), []).append(i)
        groups: list[tuple[int, ...]] = []
        for by_index in blocks.values():
            alike: dict[tuple, list[list[int]]] = {}
            for index in sorted(by_index):
                nodes = by_index[index]
                alike.setdefault(self._signature(nodes, strategies), []).append(nodes)
            groups.extend(group for same in alike.values() if len(same) > 1
                          for group in zip(*same))
        return tuple(groups)

    def _signature(self, nodes: list[int], strategies) -> tuple:
        def what(node: fx.Node):
            return node.target if node.op == "call_function" else node.op
        return tuple((what(self.by_name[self.order[i]]), strategies[i]) for i in nodes)


def build_problem(gm: fx.GraphModule, table: StrategyTable, mesh: Mesh, *,
                  memory_budget: float | None, hints: dict | None = None,
                  optimizer: OptimizerState = ADAMW, fold_layers: bool = True,
                  charges: Background = Background(),
                  saved: dict[str, Saved] | None = None,
                  microbatches: int = 1, in_flight: int = 1,
                  edge_cache: EdgeCache | None = None) -> ProblemBuild:
    """The sharding problem of an annotated graph over `mesh` (see the module docstring).

    `hints` maps the graph's size symbols to the values the solve uses; `optimizer` says
    what the optimizer keeps per parameter element; `charges` are the fractions of the
    collectives run in the background the objective counts (the rest is expected hidden
    behind compute). `saved` is
    `find_saved(gm)` when the caller has it (it runs every op once on fake tensors).
    `microbatches`: how many times a step runs `gm`, one micro-batch's graph;
    `in_flight`: how many micro-batches' activations are held at once (a pipeline stage's,
    `autopar.costs.schedule.in_flight`; one when they run one after the other).
    `edge_cache`: an `EdgeCache` of `mesh` to keep the edges' seconds in from one call to
    the next (calls that change only `charges` then compute no transfer again); by default
    a new one.
    """
    if edge_cache is not None and edge_cache.mesh != mesh:
        raise ValueError(f"an EdgeCache of mesh {edge_cache.mesh.describe()} used for "
                         f"{mesh.describe()}")
    builder = _Builder(gm, table, mesh, optimizer, hints or {}, charges,
                       saved if saved is not None else find_saved(gm), microbatches, in_flight,
                       edge_cache)
    strategies = tuple(table.strategies[name] for name in builder.order)
    nodes = [builder.by_name[name] for name in builder.order]
    edges = tuple(
        edge_ref(builder.by_name, builder.on_path, table.inputs[node.name], node.name, position,
                 builder.saved)
        for node in nodes for position in range(len(table.inputs[node.name])))
    for ref in edges:
        builder.saving_uses[ref.producer] = builder.saving_uses.get(ref.producer, 0) + ref.saved
        builder.uses[ref.producer] = builder.uses.get(ref.producer, 0) + 1
    # A folded graph's representative block stands for tied blocks: it is tied too.
    ties = builder.ties(strategies) if fold_layers or builder.fold else ()
    first_of_tie = {group[0] for group in ties}
    repeats = builder.repeats
    intervals = tuple(builder.interval(n) for n in nodes)
    held_repeats = tuple(r if end == len(nodes) else 1
                         for r, (_, end) in zip(repeats, intervals))
    problem = ShardingProblem(
        node_costs=tuple(_times(builder.node_costs(n, ss), r)
                         for n, ss, r in zip(nodes, strategies, repeats)),
        node_usages=tuple(_times(builder.node_usages(n, ss, first_of_tie=i in first_of_tie), r)
                          for i, (n, ss, r) in enumerate(zip(nodes, strategies, held_repeats))),
        intervals=intervals,
        edges=tuple((builder.index[e.producer], builder.index[e.consumer]) for e in edges),
        edge_costs=tuple(_times(builder.edge_matrix(e), repeats[builder.index[e.consumer]])
                         for e in edges),
        usage_limit=memory_budget,
        ties=ties,
        name=type(gm).__name__,
    )
    return ProblemBuild(problem, tuple(builder.order), edges, strategies, builder.on_path, mesh,
                        optimizer, microbatches, tuple(repeats), held_repeats)


def _times(values: np.ndarray, repeats: int) -> np.ndarray:
    """`values` counted `repeats` times (the array itself, shared, when once)."""
    return values if repeats == 1 else values * repeats
