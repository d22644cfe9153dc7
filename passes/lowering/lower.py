"""Lowering pass: the captured graph and its `Plan` -> one rank's program over local shards.

Reads `autopar_role`, `autopar_names` and `autopar_tensor` (capture, annotate) and the plan's
placements. Returns a `RankProgram` around a new GraphModule (the input graph is untouched)
that takes this rank's local state tensors (in `RankProgram.state` order) followed by the
flat user inputs, global as the model takes them, and returns the model's flat outputs,
global. Per node:

- every tensor input edge gets the plan's conversion, a `Collective` submodule running
  `autopar.runtime.redistribute` with exactly the transfers the plan charged for the edge,
  wherever it does anything in the forward or the backward (a replicated tensor used by a
  split computation needs no forward step, but its gradient is Partial and is all-reduced;
  for a parameter that all-reduce overlaps the rest of the backward, and so does the
  reduce-scatter of a parameter kept gathered whose edge is one gather and one scatter);
- a parameter whose plan compresses its collectives runs them compressed
  (`Redistribution.compression`: its gradient reduced in bfloat16 or by PowerSGD, its
  gathers in int8 blocks);
- ops run with this rank's local size arguments (`autopar.rules.local_args`, its own piece
  where pieces differ);
- an embedding whose table is split by rows runs `masked_embedding` from this rank's first
  row (obligation 2 of `autopar.rules`);
- an attention whose keys are split along their length runs a `RingAttention` submodule
  over that axis (obligation 5);
- a random op whose output is split draws the whole tensor's numbers and keeps this rank's
  chunk (`autopar.runtime.random_ops`, obligation 4);
- parameter gathers are chained in program order, each starting the next one's
  (`autopar.runtime.prefetch`), so that they overlap the compute between their uses;
- an op the plan recomputes runs through a `Recomputed` module that also takes its inputs as
  they were before their edges' collectives, so that the backward can rebuild its output
  instead of keeping it (`autopar.runtime.recompute`).

Edges are lowered one by one, as the plan charges them: two consumers reading the same
tensor in the same placement convert it twice. On a mesh of one device every placement is
replicated, so nothing is inserted and the program is the captured graph.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from autopar import rules
from autopar.errors import PlanFormatError
from autopar.passes.capturing.gradient_path import gradient_path
from autopar.passes.problem.build_problem import edge_ref
from autopar.passes.strategies.find_strategies import (
    Strategy,
    is_decision,
    op_spec,
    producer_of,
    tensor_inputs,
)
from autopar.passes.strategies.offer_recompute import draws_random_numbers
from autopar.rules.attention import context_axis
from autopar.rules.common import argument
from autopar.rules.embedding import is_vocab_split, masked_embedding
from autopar.runtime import random_ops
from autopar.runtime.collectives import Collective, RankContext
from autopar.runtime.grad_reduce import owns_gradient, reducible, scatterable
from autopar.runtime.prefetch import prefetchable
from autopar.runtime.program import RankProgram, StateSlot
from autopar.runtime.recompute import Recompute, Recomputed
from autopar.runtime.redistribution import Redistribution
from autopar.runtime.ring_attention import RingAttention
from autopar.values.compression import compression_named
from autopar.values.placement import (
    Placements,
    Shard,
    format_placements,
    local_shape,
    parse_placements,
    piece_offsets,
)
from autopar.values.plan import Plan
from autopar.values.specs import NAMES, ROLE, TENSOR, TensorSpec

aten = torch.ops.aten

# Export's metadata checks compare global sizes; a rank's tensors are local.
_DROPPED = (aten._assert_tensor_metadata.default,)
# A collective returns its result contiguous, where the eager op may have produced another
# memory layout (sdpa's output is laid out so that transposing it back is contiguous): a
# view after it may then need a copy, which reshape makes (it views whenever it can).
_RELAXED = {aten.view.default: aten.reshape.default}


def _placements(gm: fx.GraphModule, plan: Plan) -> dict[str, Strategy]:
    """The plan's chosen strategy of every decision node of `gm`, checked against it."""
    by_name = {n.name: n for n in plan.nodes}
    placed = {}
    for node in gm.graph.nodes:
        if not is_decision(node):
            continue
        entry = by_name.get(node.name)
        op = str(node.target) if node.op == "call_function" else node.op
        if entry is None or entry.op != op:
            raise PlanFormatError(
                f"the plan does not match the model: node {node.name!r} ({op}) is "
                + ("missing from it" if entry is None else f"{entry.op} in it"),
                expected=f"a plan of {plan.model} made from the same model and input shapes",
                got=f"a plan with {len(plan.nodes)} nodes",
                fix="plan again with autopar.plan(model, mesh, example_inputs), or compile "
                    "without plan= to plan on the fly")
        placed[node.name] = Strategy(
            tuple(map(parse_placements, entry.inputs)), parse_placements(entry.output),
            recompute=entry.recompute,
            gathered=parse_placements(entry.gathered) if entry.gathered else None,
            whole_gradient=entry.whole_gradient, compression=entry.compression or None)
    return placed


def _identifier(placements: Placements) -> str:
    return format_placements(placements).replace("(", "").replace(")", "").replace(",", "_")


class _Lowering:
    def __init__(self, gm: fx.GraphModule, plan: Plan, coordinate: tuple[int, ...],
                 context: RankContext | None, device: torch.device | None) -> None:
        self.gm, self.plan, self.coordinate, self.context = gm, plan, coordinate, context
        self.device = device
        self.mesh_shape, self.shares = plan.mesh.shape, plan.mesh.shares
        self.placed = _placements(gm, plan)
        self.on_path = gradient_path(gm)
        self.by_name = {n.name: n for n in gm.graph.nodes}
        self.graph = fx.Graph()
        self.root = nn.Module()
        self.env: dict[fx.Node, object] = {}
        self.collectives: list[tuple[str, Redistribution]] = []
        self.state: list[StateSlot] = []
        self.inputs: list[object] = []
        self.recompute: Recompute | None = None  # the scope, made at the first recomputed op
        # The last parameter gather of the program so far, which starts the next one's
        # (`autopar.runtime.prefetch`): its call node and module.
        self.last_gather: tuple[fx.Node, Collective] | None = None

    def run(self) -> RankProgram:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self.graph.placeholder(node.name)
                self._record_placeholder(node)
            elif node.op == "output":
                self.graph.output(self._arguments(node)[0][0])
            elif node.target in _DROPPED:
                continue
            elif node.target is operator.getitem or not is_decision(node):
                args, kwargs = pytree.tree_map_only(fx.Node, self.env.__getitem__,
                                                    (node.args, node.kwargs))
                self.env[node] = self.graph.create_node(
                    "call_function", node.target, args, self._on_device(kwargs),
                    name=node.name)
            else:
                self.env[node] = self._op(node)
        module = fx.GraphModule(self.root, self.graph, class_name="RankProgram")
        returned = pytree.tree_leaves(self.gm.graph.output_node().args[0])
        outputs = tuple(v.meta.get(TENSOR) if isinstance(v, fx.Node) else None for v in returned)
        return RankProgram(module, tuple(self.state), tuple(self.inputs),
                           tuple(self.collectives), self.recompute, outputs)

    def _record_placeholder(self, node: fx.Node) -> None:
        role, spec = node.meta.get(ROLE), node.meta.get(TENSOR)
        if role == "input":
            # A non-tensor input was specialised to its example value (torch.export).
            self.inputs.append(spec if isinstance(spec, TensorSpec) else node.meta.get("val"))
        else:
            placed = self.placed[node.name]
            self.state.append(StateSlot(tuple(node.meta[NAMES]), role, spec.shape, spec.dtype,
                                        placed.output, compression=placed.compression or ""))

    def _arguments(self, node: fx.Node, before: dict | None = None) -> tuple[tuple, dict]:
        """`node`'s (args, kwargs) over the new graph, each tensor input converted; `before`
        maps each converted value to (the value before its collective, the edge)."""
        leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
        inputs = tensor_inputs(node)
        position = 0
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, fx.Node):
                continue
            if isinstance(leaf.meta.get(TENSOR), TensorSpec):
                leaves[i], redistribution = self._edge(leaf, node, inputs, position)
                if before is not None and redistribution is not None:
                    before[leaves[i]] = (self.env[leaf], redistribution)
                position += 1
            else:
                leaves[i] = self.env[leaf]
        return pytree.tree_unflatten(leaves, spec)

    def _edge(self, leaf: fx.Node, consumer: fx.Node, inputs, position: int
              ) -> tuple[fx.Node, Redistribution | None]:
        ref = edge_ref(self.by_name, self.on_path, inputs, consumer.name, position)
        producer = self.placed[producer_of(leaf).name]
        src = producer.output
        dst = self.placed[consumer.name]
        spec: TensorSpec = leaf.meta[TENSOR]
        redistribution = Redistribution.for_edge(
            spec.shape, spec.dtype, src, dst.inputs[position], dst.output, self.mesh_shape,
            requires_grad=ref.requires_grad, regather=ref.saved and producer.gathered is None,
            shares=self.shares, compression=None if producer.compression is None
            else compression_named(producer.compression))
        if not redistribution.forward_steps and not redistribution.backward_steps:
            return self.env[leaf], None
        assert self.context is not None, "a collective on a mesh without a DeviceMesh"
        name = f"{leaf.name}__{_identifier(dst.inputs[position])}"
        while hasattr(self.root, name):
            name += "_"
        parameter = producer_of(leaf).meta.get(ROLE) == "parameter"
        # The edges the plan charges as reduced in the background (`edge_costs.
        # background_reductions`): a parameter gathered at its use (ZeRO-3), or kept
        # gathered (ZeRO-2) for a consumer not recomputed (one that is gathers it again).
        kept_gathered = (parameter and scatterable(redistribution)
                         and (producer.gathered is None or not dst.recompute))
        whole_gradient = kept_gathered and producer.whole_gradient
        module = Collective(
            redistribution, self.context, overlapped=parameter and reducible(redistribution),
            owned_gradient=owns_gradient(consumer.target), kept_gathered=kept_gathered,
            whole_gradient=whole_gradient, output=consumer.op == "output")
        self.root.add_module(name, module)
        self.collectives.append((name, redistribution))
        call = self.graph.call_module(name, (self.env[leaf],))
        if parameter and not whole_gradient and prefetchable(redistribution):
            self._chain_gather(call, module, self.env[leaf])
        return call, redistribution

    def _chain_gather(self, call: fx.Node, module: Collective, shard: fx.Node) -> None:
        """Have the program's previous parameter gather start this one's."""
        if self.last_gather is not None:
            previous_call, previous = self.last_gather
            previous_call.args = (previous_call.args[0], shard)
            previous.chain(module)
        self.last_gather = (call, module)

    def _op(self, node: fx.Node) -> fx.Node:
        placed, before = self.placed[node.name], {}
        args, kwargs = self._arguments(node, before)
        op = op_spec(node)
        shape = local_shape(op.outputs[0].shape, placed.output, self.mesh_shape,
                            self.coordinate, self.shares) if op.outputs else ()
        local, local_kwargs = rules.local_args(op, shape)
        args, kwargs = _substitute((args, kwargs), (local, local_kwargs))
        target, kwargs = _RELAXED.get(node.target, node.target), self._on_device(kwargs)
        if placed.inputs and any(is_vocab_split(op, p) for p in placed.inputs[0]):
            start = piece_offsets(op.inputs[0].shape, placed.inputs[0], self.mesh_shape,
                                  self.coordinate, self.shares)[0]
            padding = op.arg(2, "padding_idx", -1)
            target, args, kwargs = masked_embedding, (args[0], args[1], start, padding), {}
        ring = context_axis(op, placed.inputs)
        if ring is not None:
            return self._ring_attention(node, op, ring, args, kwargs)
        if draws_random_numbers(node) and any(isinstance(p, Shard) for p in placed.output):
            if target not in random_ops.SUPPORTED:
                raise PlanFormatError(
                    f"{target} draws random numbers and the plan splits its output",
                    expected=f"one of {sorted(map(str, random_ops.SUPPORTED))} split, or "
                             "the op replicated", got=format_placements(placed.output),
                    fix="pin its output replicated with constraints=")
            spec = op.outputs[0]
            target, args, kwargs = random_ops.seeded_piece, (target, *args), {
                **kwargs, "full_shape": tuple(spec.shape), "placements": placed.output,
                "mesh_shape": self.mesh_shape, "coordinate": self.coordinate,
                "shares": self.shares}
        if placed.recompute:
            return self._recomputed(node.name, target, args, kwargs, before)
        return self.graph.create_node("call_function", target, args, kwargs, name=node.name)

    def _ring_attention(self, node: fx.Node, op, axis: int, args: tuple,
                        kwargs: dict) -> fx.Node:
        """`node` as a `RingAttention` call over mesh axis `axis` on its (converted)
        query, key, value and mask."""
        assert self.context is not None, "context-parallel attention without a DeviceMesh"
        names = [a.name for a in node.target._schema.arguments]
        values = {**dict(zip(names, args)), **kwargs}
        module = RingAttention(self.context.mesh, axis, self.context.counter,
                               is_causal=bool(argument(op, "is_causal", False)),
                               scale=argument(op, "scale"))
        self.root.add_module(f"{node.name}__ring", module)
        return self.graph.call_module(
            f"{node.name}__ring", (values["query"], values["key"], values["value"],
                                   values.get("attn_mask")))

    def _recomputed(self, name: str, target, args: tuple, kwargs: dict,
                    before: dict[fx.Node, tuple[fx.Node, Redistribution]]) -> fx.Node:
        """The op called through a `Recomputed` module, which is given each input both as
        the op reads it and as it was before its edge's collective, to rebuild the output
        in the backward instead of keeping it."""
        if self.recompute is None:
            self.recompute = Recompute(self.context.regather if self.context else None)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        slots = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, fx.Node))
        reads = tuple(leaves[i] for i in slots)
        edges = tuple(before.get(value, (value, None)) for value in reads)
        module = Recomputed(
            target, spec, tuple(None if i in slots else leaf for i, leaf in enumerate(leaves)),
            slots, tuple(r.forward_steps if r else () for _, r in edges), self.recompute,
            self.context.mesh if self.context else None,
            self.context.counter if self.context else None)
        self.root.add_module(f"{name}__recompute", module)
        return self.graph.create_node("call_module", f"{name}__recompute",
                                      (*reads, *(value for value, _ in edges)), name=name)

    def _on_device(self, kwargs: dict) -> dict:
        device = kwargs.get("device")
        if self.device is None or not isinstance(device, torch.device) or device.type != "meta":
            return kwargs
        return {**kwargs, "device": self.device}


def _substitute(lowered: tuple, local: tuple) -> tuple:
    """`lowered` (graph values) with its non-graph leaves taken from `local` (local sizes)."""
    # The rewrite may return plain lists where fx keeps immutable ones: same leaves, and
    # the local structure is the one to call with.
    leaves = pytree.tree_leaves(lowered)
    sizes, spec = pytree.tree_flatten(local)
    assert len(leaves) == len(sizes), (lowered, local)
    return pytree.tree_unflatten(
        [value if isinstance(value, fx.Node) else size for value, size in zip(leaves, sizes)],
        spec)


def lower(gm: fx.GraphModule, plan: Plan, coordinate: tuple[int, ...],
          context: RankContext | None, device: torch.device | None = None) -> RankProgram:
    """The program of the rank at mesh `coordinate` (see the module docstring).

    `gm` is the annotated graph the plan was made from (same model, same input shapes);
    `context` carries the DeviceMesh the collectives run on, and may be None only when the
    plan needs none. A graph captured on the meta device creates its tensors (arange,
    zeros, ...) on `device` instead. Raises `PlanFormatError` when the plan does not match
    the graph.
    """
    assert len(coordinate) == plan.mesh.ndim, (coordinate, plan.mesh.shape)
    return _Lowering(gm, plan, tuple(coordinate), context, device).run()
