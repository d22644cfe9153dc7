"""Strategy pass: the candidate shardings of every node over the whole mesh.

Reads `autopar_role` and `autopar_tensor` (capture, annotate). Returns a `StrategyTable`,
not a graph: for each node that becomes a decision of the sharding problem (tensor
placeholders, ops, the output) a tuple of `Strategy`, the all-replicated one first.

Ops get their strategies from the rule registry (`autopar.rules`): the rule's single-axis
strategies, plus all-replicated, are multiplied over the mesh axes, and combinations the
rules do not admit (`rules.admissible`) are dropped. A dim that does not divide is cut as
DTensor cuts it (`autopar.values.placement`: the first pieces one longer, the last ones
shorter), or in proportion to the mesh's shares on an axis that has them, where its pieces
line up with the op's other pieces: a rule pairs dims split over the same axis, and where
one of them is cut unevenly they must all be cut at the same fractions of their lengths
(a view merging a batch cut 2, 1 of 3 rows with 16 positions into 48 rows needs the
48 cut 32, 16) over the same axes. A cut that leaves a piece empty, and a context-parallel
ring over uneven pieces, are dropped. An op without a rule keeps only the replicated
strategy, and one warning per op names it. Parameters, buffers and constants may be stored
replicated or sharded along any dim on each axis (ZeRO-3/FSDP-style storage), except that
on an axis with shares only parameters are cut (in proportion, as the ops they feed are:
tensor-parallel pieces sized by speed; checkpoints write their pieces by offset,
`autopar.tools.checkpoint`), while buffers, constants and the tensors a caller or another
stage receives stay DTensors, whole there, and a sharded parameter may instead be kept
gathered over some of its split axes from its use to its backward (ZeRO-2); user inputs
arrive whole on every rank, so they are replicated. A pipeline stage's boundary tensors
(`autopar_boundary`: the inputs it receives, the outputs it sends), and the outputs of a
graph whose caller takes them split (`autopar_sharded_outputs`), travel as each rank's
piece, so they may be split as stored tensors are (the output node then has one strategy
per combination of its tensors' placements, up to `MAX_BOUNDARY_STRATEGIES`, the smallest
tensors replicated beyond it); the pipeline planner pins a receiving stage to what the
sending stage chose.
`operator.getitem` nodes that pick one output of a multi-output op are not decisions:
they carry their producer's placement.
"""

from __future__ import annotations

import itertools
import operator
import warnings
from dataclasses import dataclass
from fractions import Fraction

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from autopar import rules
from autopar.passes.capturing.capture import is_training
from autopar.rules.attention import context_axis
from autopar.rules.base import AxisStrategy, OpSpec
from autopar.values.graph_module import argument_nodes
from autopar.values.mesh import Mesh
from autopar.values.placement import (
    Placements,
    Replicate,
    Shard,
    Shares,
    format_placements,
    piece_lengths,
    shard_count,
    smallest_piece,
    uneven_dims,
)
from autopar.values.specs import BOUNDARY, ROLE, SHARDED_OUTPUTS, TENSOR, TensorSpec

STORED_ROLES = ("parameter", "buffer", "constant")
# The most strategies a stage's sending output node gets (the product of its tensors'
# placements); beyond it, the smallest tensors are sent replicated.
MAX_BOUNDARY_STRATEGIES = 256


@dataclass(frozen=True)
class Strategy:
    """A placement for each tensor input of a node and for its output(s), over the mesh.

    Two more choices ride on a strategy. `recompute` (ops): the output is not kept for the
    backward but computed again from the op's inputs when the backward needs it. `gathered`
    (parameters stored sharded): the placement the parameter is gathered into at its use
    and kept in until the backward (ZeRO-2: sharded gradient and optimizer state, the
    parameter gathered once per step); None means gathered at each use and, when the use
    saves it, again for the backward (ZeRO-3), or not gathered at all. `whole_gradient`
    (with `gathered`, in a step of several micro-batches): the copy is gathered once per
    step and serves every micro-batch, its gradient accumulated whole and reduce-scattered
    once, after the last (ZeRO-1: the optimizer state is sharded, the gradient is whole
    during the step). `compression` (parameters): the name of the compressed collective its
    gradient is reduced with (`autopar.values.compression`), None for none.
    """

    inputs: tuple[Placements, ...]
    output: Placements
    recompute: bool = False
    gathered: Placements | None = None
    whole_gradient: bool = False
    compression: str | None = None

    @property
    def name(self) -> str:
        return format_placements(self.output)


@dataclass(frozen=True)
class StrategyTable:
    """Per decision node (by fx node name): its strategies and its tensor inputs' producers."""

    strategies: dict[str, tuple[Strategy, ...]]
    inputs: dict[str, tuple[tuple[str, TensorSpec], ...]]  # (producer decision, tensor) per input
    unsupported: tuple[str, ...]  # ops that fell back to replicated
    # Ops whose recomputed twins start from, or pass through, a tensor nothing keeps
    # (`offer_recompute`): a hand strategy's "full" or "selective" may recompute them,
    # the solver's own search does not (`offer_recompute.searched`).
    checkpointed: frozenset[str] = frozenset()


def is_decision(node: fx.Node) -> bool:
    """Nodes that choose a sharding: tensor placeholders, ops with tensor outputs, output."""
    if node.op == "output":
        return True
    if node.target is operator.getitem:
        return False
    return node.op in ("placeholder", "call_function") and node.meta.get(TENSOR) is not None


def producer_of(node: fx.Node) -> fx.Node:
    return node.args[0] if node.target is operator.getitem else node


def op_spec(node: fx.Node) -> OpSpec:
    """What a rule sees of `node` (see `OpSpec`)."""
    def convert(value):
        if isinstance(value, fx.Node):
            spec = value.meta.get(TENSOR)
            if spec is None:  # a symbolic int or other non-tensor value: its concrete value
                val = value.meta.get("val")
                return int(val.node.hint) if isinstance(val, torch.SymInt) else val
            return spec
        return value

    args = pytree.tree_map(convert, tuple(node.args))
    kwargs = pytree.tree_map(convert, dict(node.kwargs))
    tensors = [n for n in argument_nodes(node) if isinstance(n.meta.get(TENSOR), TensorSpec)]
    out = node.meta[TENSOR]
    outputs = out if isinstance(out, tuple) else (out,)
    return OpSpec(node.target, args, kwargs, tuple(n.meta[TENSOR] for n in tensors),
                  tuple(o for o in outputs if o is not None))


def tensor_inputs(node: fx.Node) -> tuple[tuple[str, TensorSpec], ...]:
    """(producing decision, tensor) of each tensor argument, in strategy input order."""
    return tuple((producer_of(n).name, n.meta[TENSOR]) for n in argument_nodes(node)
                 if isinstance(n.meta.get(TENSOR), TensorSpec))


def _fits(spec: TensorSpec, placements: Placements, mesh_shape: tuple[int, ...],
          shares: Shares = None) -> bool:
    for placement in placements:
        if isinstance(placement, Shard) and not 0 <= placement.dim < spec.ndim:
            return False
    # A whole dim always fits, even an empty one (a zero-size cache or constant); a split
    # one needs no empty piece (kernels refuse empty weights and batches: 6 rows in 4
    # would be 2, 2, 2, 0), and a dynamic one an even cut.
    for d, size in enumerate(spec.shape):
        count = shard_count(placements, mesh_shape, d)
        if count > 1 and (size % count if spec.sym_shape is not None
                          else smallest_piece(size, placements, mesh_shape, d, shares) == 0):
            return False
    return True


def lined_up(tensors: list[tuple[TensorSpec, Placements]], mesh_shape: tuple[int, ...],
             shares: Shares = None) -> bool:
    """Whether the pieces of the split dims of an op's `tensors` line up (module docstring):
    on each axis, the dims it splits are cut at the same fractions of their lengths, over
    the same axes, unless each of them is cut into pieces of one length."""
    cuts = []  # (size, splitting axes, piece lengths) of every split dim
    for spec, placements in tensors:
        for d, size in enumerate(spec.shape):
            axes = tuple(a for a, p in enumerate(placements) if p == Shard(d))
            if axes:
                cuts.append((size, axes, piece_lengths(size, placements, mesh_shape, d,
                                                       shares)))
    uneven_axes = {a for _, axes, lengths in cuts if len(set(lengths)) > 1 for a in axes}
    if not uneven_axes:  # the common case: no fractions to compare
        return True
    split: dict[int, set[tuple]] = {}
    for size, axes, lengths in cuts:
        fractions = tuple(Fraction(length, size) for length in lengths)
        for axis in uneven_axes.intersection(axes):
            split.setdefault(axis, set()).add((fractions, axes))
    return all(len(split[axis]) == 1 for axis in uneven_axes)


def _combine(per_axis: list[list[AxisStrategy]], op: OpSpec, mesh: Mesh) -> tuple[Strategy, ...]:
    seen: dict[Strategy, None] = {}
    for combo in itertools.product(*per_axis):
        strategy = Strategy(
            inputs=tuple(tuple(s.inputs[i] for s in combo) for i in range(len(op.inputs))),
            output=tuple(s.output for s in combo))
        tensors = [*zip(op.inputs, strategy.inputs), *((o, strategy.output) for o in op.outputs)]
        if all(_fits(spec, placements, mesh.shape, mesh.shares) for spec, placements in tensors) \
                and lined_up(tensors, mesh.shape, mesh.shares) \
                and rules.admissible(op, strategy.inputs, strategy.output) \
                and not _uneven_ring(op, strategy, tensors, mesh):
            seen.setdefault(strategy)
    return tuple(seen)


def _uneven_ring(op: OpSpec, strategy: Strategy, tensors: list[tuple[TensorSpec, Placements]],
                 mesh: Mesh) -> bool:
    # The ring's blocks are whole, equal chunks of the sequence.
    return context_axis(op, strategy.inputs) is not None and any(
        uneven_dims(spec.shape, placements, mesh.shape, mesh.shares)
        for spec, placements in tensors)


def _replicated(op: OpSpec) -> AxisStrategy:
    return AxisStrategy(tuple(Replicate() for _ in op.inputs), Replicate())


def _stored_strategies(spec: TensorSpec, mesh: Mesh, *, parameter: bool,
                       by_shares: bool = False) -> tuple[Strategy, ...]:
    """A stored tensor's strategies (module docstring): `parameter` adds the kept-gathered
    ones of a trained parameter, `by_shares` lets an axis with shares cut it."""
    choices = [Replicate(), *(Shard(d) for d in range(spec.ndim))]
    axis = [AxisStrategy((), c) for c in choices]
    # A DTensor's pieces are DTensor's chunks: only a parameter's may follow shares.
    per_axis = [choices[:1] if mesh.shares and mesh.shares[a] is not None and not by_shares
                else choices for a, choices in enumerate(_per_axis(axis, mesh))]
    stored = _combine(per_axis, OpSpec(None, (), outputs=(spec,)), mesh)
    if not parameter:
        return stored
    return stored + tuple(Strategy((), s.output, gathered=gathered)
                          for s in stored for gathered in _gatherings(s.output))


def _output_strategies(inputs: tuple[tuple[str, TensorSpec], ...], mesh: Mesh, *,
                       boundary: bool) -> tuple[Strategy, ...]:
    """The output node's strategies: its tensors replicated (the model's outputs, whole on
    every rank), or where they travel as pieces (`boundary`: a stage's sends, outputs the
    caller takes split) every combination of their stored placements (module docstring), the
    largest tensors first while the combinations stay within `MAX_BOUNDARY_STRATEGIES`, the
    others replicated: a transformer's stage sends its hidden state beside position ids
    and rotary tables, whose bytes are a sliver of it, and whose choices multiplied would
    leave every tensor replicated (its hidden state gathered on every rank, then sent
    whole over the pipeline axis once per micro-batch)."""
    replicated = tuple(Replicate() for _ in mesh.shape)
    whole = Strategy(tuple(replicated for _ in inputs), replicated)
    if not boundary or not inputs:
        return (whole,)
    choices = [[s.output for s in _stored_strategies(spec, mesh, parameter=False)]
               for _, spec in inputs]
    combinations = 1
    for i in sorted(range(len(inputs)), key=lambda i: -inputs[i][1].nbytes):
        if combinations * len(choices[i]) <= MAX_BOUNDARY_STRATEGIES:
            combinations *= len(choices[i])
        else:
            choices[i] = [replicated]
    # Each tensor's choices start replicated: the all-replicated strategy comes first.
    return tuple(Strategy(combo, replicated) for combo in itertools.product(*choices))


def _gatherings(stored: Placements) -> list[Placements]:
    """Every placement a parameter stored `stored` can be kept gathered in: replicated on
    some non-empty set of the axes that split it, as split as before on the others."""
    split = [axis for axis, p in enumerate(stored) if isinstance(p, Shard)]
    return [tuple(Replicate() if axis in axes else p for axis, p in enumerate(stored))
            for count in range(1, len(split) + 1)
            for axes in itertools.combinations(split, count)]


def _per_axis(axis: list[AxisStrategy], mesh: Mesh) -> list[list[AxisStrategy]]:
    # On an axis of one device every placement is the whole tensor: keep only the first
    # (replicated) choice, so equivalent strategies are not offered twice.
    return [axis if n > 1 else axis[:1] for n in mesh.shape]


def find_strategies(gm: fx.GraphModule, mesh: Mesh) -> StrategyTable:
    """Candidate strategies of every decision node of an annotated graph."""
    strategies: dict[str, tuple[Strategy, ...]] = {}
    inputs: dict[str, tuple[tuple[str, TensorSpec], ...]] = {}
    unsupported: dict[str, None] = {}
    # Repeated blocks repeat the same ops on the same shapes: one rule call each, and one
    # shared tuple, which later passes recognise by identity.
    known: dict[str, tuple[Strategy, ...]] = {}
    all_replicated = tuple(Replicate() for _ in mesh.shape)
    # A forward-only graph has no backward to keep a gathered parameter for.
    backward = is_training(gm)
    for node in gm.graph.nodes:
        if not is_decision(node):
            continue
        inputs[node.name] = tensor_inputs(node)
        if node.op == "output":
            split = bool(node.meta.get(BOUNDARY) or node.meta.get(SHARDED_OUTPUTS))
            strategies[node.name] = _output_strategies(inputs[node.name], mesh, boundary=split)
        elif node.op == "placeholder":
            spec = node.meta[TENSOR]
            role = node.meta.get(ROLE)
            key = repr((role, spec, node.meta.get(BOUNDARY)))
            if key not in known:
                parameter = role == "parameter" and not node.meta.get(BOUNDARY)
                known[key] = (_stored_strategies(spec, mesh, parameter=parameter and backward,
                                                 by_shares=parameter)
                              if role in STORED_ROLES or node.meta.get(BOUNDARY)
                              else (Strategy((), all_replicated),))
            strategies[node.name] = known[key]
        else:
            op = op_spec(node)
            key = repr((op.target, op.args, op.kwargs))
            rule = rules.lookup(node.target)
            if rule is None:
                unsupported.setdefault(str(node.target))
            if key not in known:
                axis = [_replicated(op), *(rule(op) if rule else ())]
                known[key] = _combine(_per_axis(axis, mesh), op, mesh)
            strategies[node.name] = known[key]
    if unsupported:
        warnings.warn(f"no sharding rule for {', '.join(unsupported)}: replicated",
                      stacklevel=2)
    return StrategyTable(strategies, inputs, tuple(unsupported))
