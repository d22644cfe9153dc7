"""Restriction pass: keep only the strategies a hand-written parallelism allows.

A hand strategy gives each mesh axis a role (`ROLES`):

- "dp", data parallel: parameters are stored replicated on the axis and every op reads
  them replicated; user inputs are split on their dim 0 (the batch) when its size divides.
- "zero", ZeRO-3/FSDP: parameters are stored split along some dim on the axis (replicated
  when no dim divides), and every op reads them replicated (gathered at use); user inputs as
  for "dp".
- "dopt", data parallel with a distributed optimizer (ZeRO-2, Megatron's distributed
  optimizer): parameters are stored split on the axis (gradients and optimizer states
  with them) and kept gathered from their use to their backward; inputs as for "dp".
- "tp", Megatron tensor parallel: parameters of two or more dims are stored split on the
  axis and read split (no gather: the op's compute is split, column- or row-wise); 1-dim
  parameters (biases, norm weights) are free; user inputs are read replicated.
- "cp", context parallel with FSDP over the same devices (torchtitan shards parameters
  over the data and context axes together): parameters as for "zero"; user inputs split on
  their dim 1 (the sequence) when its size divides; every attention that can runs its ring
  on the axis (`rules.attention.context_axis`).

A hand strategy may also fix activation recomputation (`RECOMPUTE`): "none"; "full", every
op that may be recomputed is, except a block's results that later blocks read (the blocks'
inputs are kept: checkpointing each block); "selective", the same but keeping the outputs
of compute-heavy ops (matmuls, attention: more than `SELECTIVE_KEEP_FLOPS_PER_BYTE`), as
Megatron's selective recomputation and torch's selective checkpointing policies do; "op",
torchtitan's op-level selective checkpointing: as "selective", but attention is always
kept and of a block's matmuls (in program order) every second one is recomputed too, the
first kept (torchtitan's policy
saves every matmul but each second one a block runs, so that a Llama block recomputes its
k, o and up projections). All three recompute from a block's inputs
(`StrategyTable.checkpointed` ops included); left free (None), the choice is the solver's
among the other ops (`offer_recompute.searched`).

Everything else (activations, buffers, how each op splits its work within those bounds) is
left to the solver, so the cheapest plan of the restricted table is the best plan of that
hand strategy under the cost model. A node left with no strategy keeps all its candidates
and is listed in `Restriction.relaxed`.

Reads `autopar_role` (parameters, user inputs) and `autopar_tensor` (their shapes); writes
nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import sympy
import torch.fx as fx

from autopar.costs.formulas import kernel_family
from autopar.errors import ShardingError
from autopar.passes.capturing.annotate import size_hints
from autopar.passes.strategies.find_strategies import Strategy, StrategyTable, op_spec
from autopar.passes.strategies.offer_recompute import recompute_region
from autopar.rules.attention import RING_TARGETS, context_axis
from autopar.values.mesh import Mesh
from autopar.values.placement import Placement, Replicate, Shard, smallest_piece
from autopar.values.specs import BYTES, FLOPS, ROLE, TENSOR, TensorSpec

ROLES = ("dp", "zero", "dopt", "tp", "cp")
RECOMPUTE = ("none", "full", "selective", "op")
# Arithmetic intensity above which selective recomputation keeps an op's output: matmuls
# and attention do hundreds of FLOPs per byte, norms and elementwise ops a few.
SELECTIVE_KEEP_FLOPS_PER_BYTE = 16

# What a placement on one axis must be: None (anything), "R", "S" (any Shard), "S0" or
# "S1" (that Shard).
Want = str | None


@dataclass(frozen=True)
class Restriction:
    """The restricted table and the nodes that kept all their candidates (none allowed)."""

    table: StrategyTable
    relaxed: tuple[str, ...]


def _ok(placement: Placement, want: Want) -> bool:
    if want is None:
        return True
    if want == "R":
        return isinstance(placement, Replicate)
    if want in ("S0", "S1"):
        return placement == Shard(int(want[1]))
    return isinstance(placement, Shard)


def _storage_wants(spec: TensorSpec, roles: Sequence[str]) -> tuple[Want, ...]:
    # A 1-dim parameter read split on a "tp" axis can't also be split on an outer axis and
    # gathered there alone (one dim cut by two axes gathers inner first): "dopt" leaves
    # biases and norm weights free, as "tp" does.
    matrix = spec.ndim >= 2
    by_role = {"dp": "R", "zero": "S", "dopt": "S" if matrix else None,
               "tp": "S" if matrix else None, "cp": "S"}
    return tuple(by_role[role] for role in roles)


def _read_wants(spec: TensorSpec, roles: Sequence[str]) -> tuple[Want, ...]:
    by_role = {"dp": "R", "zero": "R", "dopt": "R", "tp": "S" if spec.ndim >= 2 else None,
               "cp": "R"}
    return tuple(by_role[role] for role in roles)


def _gathering_ok(strategy: Strategy, roles: Sequence[str]) -> bool:
    """Kept gathered exactly over the "dopt" axes that split it, gathered at each use
    (or never) otherwise."""
    kept = [axis for axis, role in enumerate(roles)
            if role == "dopt" and isinstance(strategy.output[axis], Shard)]
    if not kept:
        return strategy.gathered is None
    return strategy.gathered is not None and all(
        isinstance(g, Replicate) if axis in kept else g == p
        for axis, (g, p) in enumerate(zip(strategy.gathered, strategy.output)))


def _input_wants(spec: TensorSpec, roles: Sequence[str], mesh: Mesh) -> tuple[Want, ...]:
    # The batch is cut over the data-parallel axes in order, outer first, as long as no
    # piece is left empty (DTensor's chunks: 7 in 4 is 2, 2, 2, 1); an axis past that
    # reads the input whole. The sequence, over the context-parallel axes, only where it
    # divides: the ring's blocks are equal chunks.
    wants: list[Want] = []
    placements: list = []
    sequence_pieces = 1
    for role, size in zip(roles, mesh.shape):
        cut = [*placements, Shard(0)] + [Replicate()] * (mesh.ndim - len(placements) - 1)
        if role == "cp":
            divides = spec.ndim >= 2 and spec.shape[1] % (sequence_pieces * size) == 0
            wants.append("S1" if divides else "R")
            sequence_pieces *= size if divides else 1
        elif role != "tp" and spec.ndim and smallest_piece(spec.shape[0], tuple(cut),
                                                           mesh.shape, 0):
            wants.append("S0")
        else:
            wants.append("R")
        placements.append(Shard(0) if wants[-1] == "S0" else Replicate())
    return tuple(wants)


def _keep_storage(candidates: tuple[Strategy, ...], wants: tuple[Want, ...],
                  roles: Sequence[str]) -> list[Strategy]:
    kept = list(candidates)
    for axis, want in enumerate(wants):
        narrowed = [s for s in kept if _ok(s.output[axis], want)]
        # Stored split where some dim divides, else replicated: that is the definition.
        kept = narrowed or [s for s in kept if _ok(s.output[axis], "R")]
    return [s for s in kept if _gathering_ok(s, roles)]


def _recompute_wanted(node: fx.Node, mode: str | None, region_output: bool,
                      hints: dict, checkpointed: bool, ordinals: dict[str, int]) -> bool | None:
    """Whether `mode` recomputes `node` (None: the solver chooses; it leaves a
    `checkpointed` op, one that checkpointing a block recomputes, kept). `ordinals`: each
    matmul's place (from 1) among its block's matmuls (`_matmul_ordinals`)."""
    if mode is None:
        return False if checkpointed else None
    if node.meta.get(BYTES, 0) == 0:
        return None  # a view's flag follows its base's (build_problem keeps them equal)
    if mode == "none" or region_output:
        return False
    if mode == "full":
        return True
    if mode == "op" and node.name in ordinals:
        return ordinals[node.name] % 2 == 0
    if mode == "op" and node.target in RING_TARGETS:
        return False  # torchtitan's policy saves attention's output whatever its size
    flops, nbytes = node.meta.get(FLOPS, 0), node.meta.get(BYTES, 0)
    # The ratio of two size formulas is a number when both scale alike; compare at sizes
    # the graph was captured with otherwise.
    intensity = sympy.sympify(flops) / sympy.sympify(nbytes) if nbytes else 0
    return not float(intensity.subs(hints) if hasattr(intensity, "subs") else intensity) \
        > SELECTIVE_KEEP_FLOPS_PER_BYTE


def _keep_recompute(candidates: tuple[Strategy, ...], wanted: bool | None) -> tuple:
    if wanted is None or not any(s.recompute for s in candidates):
        return candidates  # the op can't be recomputed: nothing to fix
    return tuple(s for s in candidates if s.recompute == wanted)


def _keep_op(candidates: tuple[Strategy, ...],
             wants: tuple[tuple[int, tuple[Want, ...]], ...]) -> list[Strategy]:
    return [s for s in candidates
            if all(_ok(s.inputs[position][axis], want)
                   for position, per_axis in wants for axis, want in enumerate(per_axis))]


def _keep_rings(node: fx.Node, candidates: tuple[Strategy, ...],
                ring_axes: tuple[int, ...]) -> tuple[Strategy, ...]:
    """An attention's strategies that run the ring on a "cp" axis, where it has any."""
    if not ring_axes or node.target not in RING_TARGETS:
        return candidates
    op = op_spec(node)
    rings = tuple(s for s in candidates if context_axis(op, s.inputs) in ring_axes)
    return rings or candidates


def _check_roles(roles: Sequence[str], mesh: Mesh, recompute: str | None) -> tuple[str, ...]:
    roles = tuple(roles)
    if len(roles) != mesh.ndim or any(role not in ROLES for role in roles):
        raise ShardingError("a hand strategy needs one role per mesh axis",
                            expected=f"{mesh.ndim} of {ROLES}", got=repr(roles),
                            fix=f"e.g. {('dp',) * mesh.ndim}")
    if roles.count("cp") > 1:
        raise ShardingError("one axis at most runs the attention ring",
                            expected='at most one "cp" role', got=repr(roles),
                            fix='give the other axes "dp", "zero", "dopt" or "tp"')
    if recompute is not None and recompute not in RECOMPUTE:
        raise ShardingError("unknown recomputation mode", expected=f"None or one of {RECOMPUTE}",
                            got=repr(recompute), fix="e.g. recompute='selective'")
    return roles


def _matmul_ordinals(gm: fx.GraphModule) -> dict[str, int]:
    """Each matmul's place (from 1) among the matmuls of its recompute region, in program
    order (`formulas.kernel_family`: linear, mm, addmm, bmm, matmul, einsum)."""
    ordinals: dict[str, int] = {}
    counts: Counter[str] = Counter()
    for node in gm.graph.nodes:
        if node.op == "call_function" and kernel_family(node.target) == "matmul":
            region = recompute_region(node)
            counts[region] += 1
            ordinals[node.name] = counts[region]
    return ordinals


def _region_outputs(gm: fx.GraphModule) -> set[str]:
    """Ops read by a node of another recompute region (a block's results)."""
    return {node.name for node in gm.graph.nodes if node.op == "call_function"
            and any(user.op == "call_function"
                    and recompute_region(user) != recompute_region(node)
                    for user in node.users)}


def restrict(gm: fx.GraphModule, table: StrategyTable, mesh: Mesh,
             roles: Sequence[str], recompute: str | None = None) -> Restriction:
    """`table` cut down to the strategies allowed by `roles` (one of `ROLES` per mesh axis)
    and by `recompute` (one of `RECOMPUTE`, None: free), see the module docstring. Axes of
    one device are never restricted. Nodes whose strategy tuples are shared (identical ops)
    share the restricted tuple too, so the problem pass still recognises repeated blocks."""
    roles = _check_roles(roles, mesh, recompute)
    free_axes = tuple(size == 1 for size in mesh.shape)
    ring_axes = tuple(axis for axis, role in enumerate(roles)
                      if role == "cp" and not free_axes[axis])
    by_name = {node.name: node for node in gm.graph.nodes}
    region_outputs = _region_outputs(gm) if recompute is not None else set()
    ordinals = _matmul_ordinals(gm) if recompute == "op" else {}
    hints = size_hints(gm)

    def unrestricted(wants: tuple[Want, ...]) -> tuple[Want, ...]:
        return tuple(None if free else want for want, free in zip(wants, free_axes))

    strategies: dict[str, tuple[Strategy, ...]] = {}
    relaxed: list[str] = []
    cache: dict[tuple, tuple[Strategy, ...] | None] = {}
    for name, candidates in table.strategies.items():
        node = by_name[name]
        if node.op == "placeholder":
            spec = node.meta.get(TENSOR)
            kind = "storage"
            wants = (unrestricted(_storage_wants(spec, roles))
                     if node.meta.get(ROLE) == "parameter" else ())
        elif node.op == "output":
            kind, wants = "output", ()
        else:
            kind = "op"
            wants = []
            for position, (producer, spec) in enumerate(table.inputs[name]):
                role = by_name[producer].meta.get(ROLE)
                if role == "parameter":
                    wants.append((position, unrestricted(_read_wants(spec, roles))))
                elif role == "input":
                    wants.append((position, unrestricted(_input_wants(spec, roles, mesh))))
            wants = tuple(wants)
        wanted = (_recompute_wanted(node, recompute, name in region_outputs, hints,
                                    name in table.checkpointed, ordinals) if kind == "op" else None)

        key = (id(candidates), kind, wants, wanted)
        if key not in cache:
            if kind == "output" or (not wants and wanted is None and not (
                    ring_axes and node.target in RING_TARGETS)):
                cache[key] = candidates
            else:
                kept = (_keep_storage(candidates, wants, roles) if kind == "storage"
                        else _keep_op(_keep_rings(node, _keep_recompute(candidates, wanted),
                                                  ring_axes), wants))
                cache[key] = tuple(kept) if kept else None
        kept = cache[key]
        if kept is None:
            relaxed.append(name)
            kept = candidates
        strategies[name] = kept
    return Restriction(StrategyTable(strategies, table.inputs, table.unsupported),
                       tuple(relaxed))
