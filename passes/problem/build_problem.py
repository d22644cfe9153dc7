"""Problem pass: turn the strategy table into a `ShardingProblem` of seconds and bytes.

Reads `autopar_role`, `autopar_names`, `autopar_module`, `autopar_tensor`, `autopar_flops`
and `autopar_bytes`. Writes nothing into the graph; returns a `ProblemBuild` that keeps the
map from problem indices back to graph nodes and tensors.

- Node cost of a strategy: forward plus backward compute of one rank (roofline), the work
  divided over the axes where the strategy splits it (`formulas.compute_divisor`). Ops off the
  gradient path (masks, position tables) pay no backward. A context-parallel attention
  adds the part of its ring's transfers that its compute does not hide (`op_costs.op_time`). A
  parameter's node cost is the optimizer's step of its stored piece, once per step
  (`op_costs.parameter_step_time`): storing it sharded (ZeRO) divides that work too.
- Edge cost: the forward collectives that turn the producer's placement into the one the
  consumer's strategy wants, plus the backward collectives derived in `autopar.costs.formulas`. A
  parameter's gradient reduction that the runtime overlaps with the rest of the backward
  (`background_reductions`; packed into buckets, each gradient paying its share of a
  bucket's latency, `EdgeRef.bucket_bytes`), and a parameter's gather it starts one use ahead
  (`background_gathers`), count at the `Background` fractions of their time (the caller's
  estimate of the part left exposed; see `autopar.planning.graph.plan_table`). The edges' costs are
  `passes/problem/edge_costs.py`'s: an edge's matrix is computed once per distinct signature
  of its pairs of strategies (`passes/problem/edge_cache.py`), and kept, apart from the
  charges, for the next problem built with the same `EdgeCache`.
- Memory per device, on a training step's timeline (`step_memory.Timeline`: the forward,
  the backward, the optimizer's step): parameters with their gradient, master copy and
  optimizer states (`autopar.costs.optimizer_state`; the three where the parameter is
  stored, the parameter itself also gathered, once per use that saves it, when kept
  gathered: ZeRO-2), buffers, user inputs, and what autograd keeps for the backward
  (`find_saved`): the outputs some op saves (views share their base's storage and add
  nothing) and the tensors ops save inside (statistics, log-softmax), split as the op's
  work is. Stored tensors live for the whole step, kept activations from their op to its
  backward, others until their last use. A recomputed op keeps no output.
- Memory per edge (`edge_costs.held_bytes`, an `EdgeUsage` of the problem over [consumer,
  its backward]): a consumer that keeps what it reads (`kept_reads`) through a
  collective keeps the collective's copy, at its read placement (a tensor off the
  gradient path cut along dim 0 over one axis is handed on as a view: no copy,
  `edge_costs.sliced_view`). An output kept through
  one edge only (`EdgeRef.owns`: its op does not save it, one consumer or chain of views
  does) is charged on that edge, not on its op: held when the edge does not convert it,
  freed after the collective when it does.
- What the backward and the optimizer's step add (`step_memory.BackwardUsages`): the
  gradients made and held, recomputed outputs rebuilt, the conversions' transient copies,
  a context-parallel ring's blocks in flight, the optimizer's temporaries.
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
  graph counts r times in compute, in the edges into it and, when held past the end of the
  forward, in memory; the problem is the unfolded one's, tied.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass

import numpy as np
import torch.fx as fx

from autopar.costs import formulas, uneven
from autopar.costs.optimizer_state import ADAMW, OptimizerState
from autopar.costs.ring import Ring
from autopar.passes.capturing.find_saved import (
    Saved,
    find_saved,
    kept_outputs,
    storage_base,
    storage_path,
    written_base,
)
from autopar.passes.capturing.gradient_path import (
    gradient_path,
    is_differentiable,
    passes_gradient,
    tensor_outputs,
    trained,
)
from autopar.passes.capturing.trace_kernels import priced_kernels
from autopar.passes.capturing.write_back import writes_first_argument
from autopar.passes.problem.edge_cache import EdgeCache
from autopar.passes.problem.edge_costs import Background, EdgeRef
from autopar.passes.problem.op_costs import (
    compression_time,
    op_ring,
    op_time,
    parameter_bytes,
    parameter_step_time,
)
from autopar.passes.problem.step_memory import BackwardUsages, Timeline, microbatch_copies
from autopar.passes.strategies.find_strategies import STORED_ROLES, Strategy, StrategyTable
from autopar.passes.strategies.offer_recompute import recompute_region
from autopar.solver.edge_usage import nodes_floor
from autopar.solver.problem import EdgeUsage, ShardingProblem
from autopar.values.graph_module import argument_nodes
from autopar.values.mesh import Mesh
from autopar.values.specs import (
    BLOCK,
    BYTES,
    FLOPS,
    FOLD,
    ROLE,
    TENSOR,
    TensorSpec,
    module_of,
)


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
    # Memory: the micro-batches whose activations are held at once.
    in_flight: int = 1
    # The ops whose backward reads their own output (`find_saved`: softmax, attention; an
    # op it does not know), so that recomputing them means rebuilding them (`rebuilt`).
    saves_output: frozenset[str] = frozenset()

    @property
    def timed_gradients(self) -> bool:
        return timed_gradients(self.microbatches, self.in_flight)


def timed_gradients(microbatches: int, in_flight: int) -> bool:
    """Whether parameters' gradients have an interval of their own, outside their nodes'
    usages: when every forward of the step runs before the first backward (one micro-batch,
    or all of them in flight: GPipe, a pipeline rank's warm-up that covers the step), the
    backward makes them; otherwise a forward runs while they are held, accumulated from
    the first backward on, so they count the whole step."""
    return microbatches <= in_flight


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
                   consumer_saves=entry is None or position in entry.inputs,
                   producer_off_path=not on_path[producer],
                   consumer_writes=position == 0 and writes_first_argument(node))


def tensor_leaves(node: fx.Node) -> list[fx.Node]:
    """`node`'s tensor arguments in graph order: the positions of its edges and of
    `find_saved`'s saved inputs."""
    return [leaf for leaf in argument_nodes(node)
            if isinstance(leaf.meta.get(TENSOR), TensorSpec)]


def _views_to_storage(node: fx.Node) -> list[fx.Node]:
    """The view ops (moving no bytes) between `node` and the op that wrote its storage
    (`find_saved.storage_path`)."""
    return storage_path(node)[0]


def kept_reads(gm: fx.GraphModule, saved: dict[str, Saved],
               on_path: dict[str, bool]) -> frozenset[tuple[str, int]]:
    """The edges, as (consumer, tensor input position), whose consumer keeps for the
    backward the tensor the edge hands it: an op on the gradient path that saves that input
    (`saved`; all of them for an op `find_saved` does not know), or a view whose output
    such an op keeps, directly or through further views and getitems (the edges
    `kept_outputs` follows to mark an output kept)."""
    kept_views: dict[str, fx.Node] = {}
    reads: set[tuple[str, int]] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not on_path[node.name]:
            continue
        leaves = tensor_leaves(node)
        entry = saved.get(node.name)
        for position in (entry.inputs if entry is not None else range(len(leaves))):
            if position < len(leaves):
                reads.add((node.name, position))
                kept_views.update((v.name, v) for v in _views_to_storage(leaves[position]))
    for name, view in kept_views.items():
        reads.update((name, position) for position in range(len(tensor_leaves(view))))
    return frozenset(reads)


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
        self.timed_gradients = timed_gradients(microbatches, in_flight)
        self.by_name = {n.name: n for n in gm.graph.nodes}
        self.order = [n.name for n in gm.graph.nodes if n.name in table.strategies]
        self.index = {name: i for i, name in enumerate(self.order)}
        self.timeline = Timeline(
            len(self.order), tuple(i for i, name in enumerate(self.order)
                                   if trained(self.by_name[name])),
            per_tensor=not mesh.hardware.multi_tensor_optimizer, in_flight=in_flight)
        self.on_path = gradient_path(gm)
        self.saved = saved
        self.kept = kept_outputs(gm, saved)
        self.fold = gm.meta.get(FOLD)
        self.repeats = [self.fold.repeats(name) if self.fold else 1 for name in self.order]
        self.owned: dict[str, frozenset[int]] = {}  # op -> outputs an edge charges (`owns`)
        self.saving_uses: dict[str, int] = {}  # parameter -> uses that save it
        self.uses: dict[str, int] = {}  # parameter -> uses
        self.edge_cache = edge_cache if edge_cache is not None else EdgeCache(mesh)
        self.matrices: dict[int, np.ndarray] = {}  # id(EdgeSecondsTable) -> charged matrix
        self.arrays: dict[tuple, np.ndarray] = {}  # (id(strategies), what a node reads) -> costs

    def node_costs(self, node: fx.Node, strategies: tuple[Strategy, ...]) -> np.ndarray:
        """`node_cost` of each of `strategies`, computed once for the nodes that have them
        and are alike in all it reads (the nodes of repeated blocks)."""
        if node.meta.get(ROLE) == "parameter":
            reads: tuple = ("parameter", tensor_outputs(node)[0], trained(node))
        elif node.op != "call_function":
            reads = ("no op",)
        else:
            kernels, nbytes = priced_kernels(node, self.mesh.hardware.device)
            flops, nbytes = (_number(value, self.hints)
                             for value in (node.meta.get(FLOPS, 0), nbytes))
            reads = ("op", flops, nbytes, tensor_outputs(node)[0].dtype if flops or nbytes
                     else None, self.on_path[node.name], formulas.kernel_family(node.target),
                     kernels)
        return self._array((id(strategies), "cost", reads),
                           lambda: [self.node_cost(node, s) for s in strategies])

    def node_usages(self, node: fx.Node, strategies: tuple[Strategy, ...]) -> np.ndarray:
        """The usage of each of `strategies` over the node's `interval`: its `own_usages`
        times its `microbatch_copies`."""
        own = self.own_usages(node, strategies)
        copies = microbatch_copies(node, self.on_path[node.name], self.in_flight)
        if copies == 1:
            return own
        return self._array((id(own), "copies", copies), lambda: own * copies)

    def own_usages(self, node: fx.Node, strategies: tuple[Strategy, ...]) -> np.ndarray:
        """`own_usage` of each of `strategies`, computed once for the nodes that have them
        and are alike in all it reads."""
        name = node.name
        reads = (node.meta.get(ROLE), trained(node), node.op, tensor_outputs(node),
                 self.saving_uses.get(name, 0), self.uses.get(name, 0),
                 _number(node.meta.get(BYTES, 0), self.hints) == 0, self.saved.get(name),
                 self.kept.get(name), self.owned.get(name), self.on_path.get(name))
        return self._array((id(strategies), "usage", reads), lambda: [
            self.own_usage(node, s) for s in strategies])

    def _array(self, key: tuple, values) -> np.ndarray:
        found = self.arrays.get(key)
        if found is None:
            found = self.arrays[key] = np.array(values(), dtype=float)
        return found

    def node_cost(self, node: fx.Node, strategy: Strategy) -> float:
        """Seconds of a step: an op's compute over every micro-batch; a parameter's
        optimizer step, once (`parameter_step_time`; none for a frozen one), and the casts
        of its compressed collectives, once (`compression_time`)."""
        if node.meta.get(ROLE) == "parameter":
            if not trained(node):
                return 0.0
            spec = tensor_outputs(node)[0]
            return float(parameter_step_time(spec, strategy.output, self.mesh, self.optimizer)
                         + compression_time(spec, strategy, self.mesh))
        return self.microbatches * float(op_time(
            node, strategy, self.mesh, differentiable=self.on_path[node.name],
            size=lambda value: _number(value, self.hints)))

    def own_usage(self, node: fx.Node, strategy: Strategy) -> float:
        """Bytes the node holds while live, for one micro-batch: a parameter with its
        gradient and optimizer state; an activation (a user or boundary input, what an op
        keeps)."""
        role = node.meta.get(ROLE)
        if role == "parameter":
            return float(parameter_bytes(tensor_outputs(node)[0], strategy, self.mesh,
                                         self.optimizer, self.saving_uses.get(node.name, 0),
                                         self.uses.get(node.name, 0),
                                         gradient=not self.timed_gradients,
                                         trained=trained(node), in_flight=self.in_flight))
        held = sum(formulas.local_bytes(uneven.cost_bytes(s, self.mesh), strategy.output,
                                        self.mesh.shape)
                   for s in tensor_outputs(node)) if node.op != "output" else 0
        if role in STORED_ROLES or role == "input":
            return float(held)
        if self.moves_no_bytes(node):
            return 0.0  # a view shares its base's storage
        entry = self.saved.get(node.name)
        if entry is None:  # unknown to find_saved: its output is kept
            return 0.0 if strategy.recompute else float(held)
        kept = self.kept[node.name] - self.owned.get(node.name, frozenset())
        divisor = formulas.compute_divisor(strategy.inputs, strategy.output, self.mesh.shape)
        outputs = 0.0 if strategy.recompute else self.output_bytes(node, strategy, kept)
        return float(outputs + entry.internal_bytes / divisor)

    def output_bytes(self, node: fx.Node, strategy: Strategy,
                      outputs: frozenset[int] | None = None) -> float:
        """The local bytes of `node`'s `outputs` (default: all of them) at its output
        placement under `strategy`."""
        return float(sum(formulas.local_bytes(uneven.cost_bytes(spec, self.mesh),
                                              strategy.output, self.mesh.shape)
                         for k, spec in enumerate(tensor_outputs(node))
                         if outputs is None or k in outputs))

    def interval(self, node: fx.Node) -> tuple[int, int]:
        """The time steps (`Timeline`) the node's usage counts at: a stored tensor or input
        the whole step; what an op on the gradient path keeps, from its step to its
        backward; another op's output until its last decision user."""
        if node.op == "placeholder":
            return (0, self.timeline.steps)
        start = self.index[node.name]
        entry = self.saved.get(node.name)
        kept_nothing = entry is not None and not self.kept[node.name] \
            and entry.internal_bytes == 0
        if node.op == "output":
            return (start, self.timeline.steps)
        if self.on_path[node.name] and not kept_nothing:
            return (start, self.timeline.freed(start))
        return (start, self.last_use(node) + 1)

    def last_use(self, node: fx.Node) -> int:
        """The index of the last decision node that reads `node` (its own if none)."""
        return max((self.index[u] for u in self.decision_users(node)),
                   default=self.index[node.name])

    def decision_users(self, node: fx.Node):
        """The names of the decision nodes that read `node` (through getitems)."""
        for user in node.users:
            if user.name in self.index:
                yield user.name
            else:  # getitem and other pass-through nodes
                yield from self.decision_users(user)

    def moves_no_bytes(self, node: fx.Node) -> bool:
        """Whether `node` is a view: its output is its input's storage."""
        return _number(node.meta.get(BYTES, 0), self.hints) == 0

    def ring(self, node: fx.Node, strategy: Strategy) -> Ring | None:
        """The context-parallel ring `node` runs under `strategy` (`op_ring`), if any."""
        return op_ring(node, strategy, self.mesh, size=lambda v: _number(v, self.hints))

    def with_memory_flags(self, edges: tuple[EdgeRef, ...]) -> tuple[EdgeRef, ...]:
        """`edges` with `keeps` and `owns` set (`edge_costs.held_bytes`), once each
        parameter's uses are counted; `owned` filled: an output of an op on the gradient
        path that the op does not save itself, which exactly one edge keeps, is charged on
        that edge."""
        for ref in edges:
            self.saving_uses[ref.producer] = self.saving_uses.get(ref.producer, 0) + ref.saved
            self.uses[ref.producer] = self.uses.get(ref.producer, 0) + 1
        reads = kept_reads(self.gm, self.saved, self.on_path)
        keeps = [not ref.producer_is_parameter and (ref.consumer, ref.position) in reads
                 for ref in edges]
        hops: dict[tuple[str, int], list[int]] = {}
        for e, ref in enumerate(edges):
            if keeps[e]:
                leaf = tensor_leaves(self.by_name[ref.consumer])[ref.position]
                output = leaf.args[1] if leaf.target is operator.getitem else 0
                hops.setdefault((ref.producer, output), []).append(e)
        owners = {found[0]: out for out, found in hops.items()
                  if len(found) == 1 and self._may_own(*out)}
        owned: dict[str, set[int]] = {}
        for name, output in owners.values():
            owned.setdefault(name, set()).add(output)
        self.owned = {name: frozenset(outputs) for name, outputs in owned.items()}
        recipes = self._one_recipe_each([self._recipe_only(ref, keep, hops)
                                         for ref, keep in zip(edges, keeps)], edges)
        return tuple(dataclasses.replace(ref, keeps=keep, owns=e in owners,
                                         recipe=recipes[e] is not None)
                     for e, (ref, keep) in enumerate(zip(edges, keeps)))

    def _recipe_only(self, ref: EdgeRef, keeps: bool, hops: dict) -> tuple[str, int] | None:
        """The storage (writer, output) only a recipe would keep through edge `ref`
        (`EdgeRef.recipe`), else None: its consumer, an op that writes its output, does not
        keep what it reads, and no edge keeps the producer's output, which the producer (an
        op that writes it, or a view of one: `find_saved.written_base`) does not save."""
        consumer = self.by_name[ref.consumer]
        if keeps or consumer.op != "call_function" or self.moves_no_bytes(consumer):
            return None
        leaf = tensor_leaves(consumer)[ref.position]
        output = leaf.args[1] if leaf.target is operator.getitem else 0
        if (ref.producer, output) in hops:
            return None
        base = written_base(self.by_name[ref.producer]) if output == 0 else None
        if base is not None and base.name != ref.producer:  # a view: its writer's storage
            return (base.name, 0) if (base.name, 0) not in hops and self._may_own(
                base.name, 0) else None
        return (ref.producer, output) if self._may_own(ref.producer, output) else None

    def _one_recipe_each(self, storages: list, edges: tuple[EdgeRef, ...]) -> list:
        """`storages` (per edge, what its recipe would keep) with one edge left per storage
        that some consumer always recomputes (every strategy of it recomputed: a hand
        strategy's checkpointed block): that recipe keeps the storage, the others' add
        nothing. Elsewhere each recipe charges it, an over-count where two consumers the
        solver may recompute read one tensor (the usage of a third node is no edge's)."""
        first: dict[tuple[str, int], int] = {}
        for e, storage in enumerate(storages):
            if storage is not None and storage not in first and self._always_recomputed(
                    edges[e].consumer):
                first[storage] = e
        return [None if storage in first and first[storage] != e else storage
                for e, storage in enumerate(storages)]

    def _always_recomputed(self, name: str) -> bool:
        """Whether every strategy of `name`, or of the op whose output it views (a view
        carries its base's flag), recomputes it."""
        base, _ = storage_base(self.by_name[name])
        strategies = self.table.strategies.get(base.name, ())
        return bool(strategies) and all(s.recompute for s in strategies)

    def with_recomputed(self, edges: tuple[EdgeRef, ...]) -> tuple[EdgeRef, ...]:
        """`edges` with `producer_recomputed` set where the producer is always recomputed."""
        return tuple(dataclasses.replace(e, producer_recomputed=True)
                     if self._always_recomputed(e.producer) else e for e in edges)

    def saving_outputs(self, nodes: list[fx.Node]) -> frozenset[str]:
        """The ops among `nodes` whose backward reads their own output
        (`ProblemBuild.saves_output`)."""
        return frozenset(n.name for n in nodes if not self.moves_no_bytes(n) and (
            self.saved.get(n.name) is None or self.saved[n.name].outputs))

    def with_buckets(self, edges: tuple[EdgeRef, ...]) -> tuple[EdgeRef, ...]:
        """`edges` with `bucket_bytes` set on those of parameters: the runtime's bucket, or
        all the parameters' gradients where they fill less (one bucket holds them all)."""
        gradients = sum(self.repeats[i] * _number(self.by_name[name].meta[TENSOR].nbytes,
                                                  self.hints)
                        for i, name in enumerate(self.order)
                        if self.by_name[name].meta.get(ROLE) == "parameter"
                        and self.on_path[name])
        bucket = int(min(formulas.GRADIENT_BUCKET_BYTES, gradients))
        return tuple(dataclasses.replace(e, bucket_bytes=bucket) if e.producer_is_parameter
                     else e for e in edges)

    def _may_own(self, name: str, output: int) -> bool:
        """Whether output `output` of `name` is an op's, on the gradient path, which the op
        writes (not a view) and does not save itself."""
        node, entry = self.by_name[name], self.saved.get(name)
        return (node.op == "call_function" and self.on_path[name] and entry is not None
                and node.meta.get(BYTES, 0) != 0 and output not in entry.outputs)

    def edge_usages(self, edges: tuple[EdgeRef, ...]) -> tuple[EdgeUsage, ...]:
        """The problem's `EdgeUsage`s (0 where a pair is forbidden, none where all are 0):
        per edge that keeps what it hands on, what it holds for the backward
        (`EdgeCache.held`) over [consumer, its backward], counted for the nodes the
        consumer stands for and the micro-batches in flight; and what the backward and the
        optimizer's step add (`step_memory.BackwardUsages`)."""
        usages = []
        shared: dict[tuple, tuple] = {}  # edges of tied blocks share their arrays
        for ref in edges:
            if not (ref.keeps or ref.recipe):
                continue
            p, c = self.index[ref.producer], self.index[ref.consumer]
            cost, factor = self.edge_matrix(ref), self.repeats[c] * self.in_flight
            parts = self._held_parts(ref, cost)
            key = (*map(id, parts), id(cost), factor)
            found = shared.get(key)
            if found is None:
                found = shared[key] = tuple(part * factor for part in parts)
            usages.extend(EdgeUsage((p, c), part, (c, self.timeline.freed(c)))
                          for part in found if part.any())
        return tuple(usages) + BackwardUsages(self, edges).all()

    def _held_parts(self, ref: EdgeRef, cost: np.ndarray) -> tuple:
        """What edge `ref` holds (`EdgeCache.held`, 0 where `cost` forbids the pair), as
        matrices that add up to it: for an edge that owns its producer's output, the part
        of its consumer alone and that of its producer alone (`EdgeCache.owned_parts`), an
        exact usage of one node each (the producer's is negative: what a recomputed output
        does not hold), and the rest, which depends on both (a recomputed consumer's
        conversion); else the whole. On every pair `cost` allows, the parts sum to the
        held bytes, at least 0 (`autopar.solver.EdgeUsage`)."""
        src, dst = self.table.strategies[ref.producer], self.table.strategies[ref.consumer]
        held = self.edge_cache.held(ref, src, dst)
        finite = np.isfinite(cost)
        if ref.owns:
            reads, outputs = self.edge_cache.owned_parts(ref, src, dst)
            rest = np.where(finite, held - reads[None, :] - outputs[:, None], 0.0)
            if (rest >= 0).all():
                return (np.broadcast_to(reads, held.shape),
                        np.broadcast_to(outputs[:, None], held.shape), rest)
        return (np.where(finite, held, 0.0),)

    def edge_refs(self, nodes: list[fx.Node]) -> tuple[EdgeRef, ...]:
        """Every tensor input's edge, with its memory flags, buckets and recomputation;
        recording what each node's output is held for (`with_memory_flags`), which its
        usages read."""
        edges = tuple(
            edge_ref(self.by_name, self.on_path, self.table.inputs[node.name], node.name,
                     position, self.saved)
            for node in nodes for position in range(len(self.table.inputs[node.name])))
        return self.with_recomputed(self.with_buckets(self.with_memory_flags(edges)))

    def node_terms(self, nodes: list[fx.Node], strategies) -> tuple[tuple, tuple, tuple, tuple]:
        """The nodes' cost and usage vectors over their strategies, their intervals, and how
        many times each one's memory counts: as many as the nodes it stands for when held
        to the end of the forward, else once (costs always count them all)."""
        intervals = tuple(self.interval(n) for n in nodes)
        held = tuple(r if end >= len(nodes) else 1
                     for r, (_, end) in zip(self.repeats, intervals))
        costs = tuple(_times(self.node_costs(n, ss), r)
                      for n, ss, r in zip(nodes, strategies, self.repeats))
        usages = tuple(_times(self.node_usages(n, ss), r)
                       for n, ss, r in zip(nodes, strategies, held))
        return costs, usages, intervals, held

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
                  edge_cache: EdgeCache | None = None,
                  unfit_early: bool = False) -> ProblemBuild:
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
    a new one. With `unfit_early`, where the nodes alone hold more than `memory_budget` at
    some step whatever their strategies (`usage_floor`), the problem is theirs alone, its
    edges not built (most of the building): no plan fits either way, and its solve proves
    it at once; for a caller that needs no least memory of the full problem.
    """
    if edge_cache is not None and edge_cache.mesh != mesh:
        raise ValueError(f"an EdgeCache of mesh {edge_cache.mesh.describe()} used for "
                         f"{mesh.describe()}")
    builder = _Builder(gm, table, mesh, optimizer, hints or {}, charges,
                       saved if saved is not None else find_saved(gm), microbatches, in_flight,
                       edge_cache)
    strategies = tuple(table.strategies[name] for name in builder.order)
    nodes = [builder.by_name[name] for name in builder.order]
    edges = builder.edge_refs(nodes)  # first: they say which outputs the nodes hold
    costs, usages, intervals, held = builder.node_terms(nodes, strategies)
    unfit = unfit_early and memory_budget is not None \
        and nodes_floor(costs, usages, intervals) > memory_budget
    edges = () if unfit else edges
    problem = ShardingProblem(
        node_costs=costs, node_usages=usages, intervals=intervals,
        edges=tuple((builder.index[e.producer], builder.index[e.consumer]) for e in edges),
        edge_costs=tuple(_times(builder.edge_matrix(e), builder.repeats[builder.index[
            e.consumer]]) for e in edges),
        usage_limit=memory_budget,
        # A folded graph's representative block stands for tied blocks: it is tied too.
        ties=builder.ties(strategies) if not unfit and (fold_layers or builder.fold) else (),
        name=type(gm).__name__,
        edge_usages=() if unfit else builder.edge_usages(edges))
    return ProblemBuild(problem, tuple(builder.order), edges, strategies, builder.on_path, mesh,
                        optimizer, microbatches, tuple(builder.repeats), held, in_flight,
                        builder.saving_outputs(nodes))


def _times(values: np.ndarray, repeats: int) -> np.ndarray:
    """`values` counted `repeats` times (the array itself, shared, when once)."""
    return values if repeats == 1 else values * repeats
