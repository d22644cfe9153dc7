"""Restriction pass: keep only the strategies a hand-written parallelism allows.

A hand strategy gives each mesh axis a role (`ROLES`):

- "dp", data parallel: parameters are stored replicated on the axis and every op reads
  them replicated; user inputs are split on their dim 0 (the batch) when its size divides.
- "zero", ZeRO-3/FSDP: parameters are stored split along some dim on the axis (replicated
  when no dim divides), and every op reads them replicated (gathered at use); user inputs as
  for "dp".
- "tp", Megatron tensor parallel: parameters of two or more dims are stored split on the
  axis and read split (no gather: the op's compute is split, column- or row-wise); 1-dim
  parameters (biases, norm weights) are free; user inputs are read replicated.

Everything else (activations, buffers, how each op splits its work within those bounds) is
left to the solver, so the cheapest plan of the restricted table is the best plan of that
hand strategy under the cost model. A node left with no strategy keeps all its candidates
and is listed in `Restriction.relaxed`.

Reads `autopar_role` (parameters, user inputs) and `autopar_tensor` (their shapes); writes
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch.fx as fx

from autopar.errors import ShardingError
from autopar.mesh import Mesh
from autopar.passes.find_strategies import Strategy, StrategyTable
from autopar.placement import Placement, Replicate, Shard
from autopar.specs import ROLE, TENSOR, TensorSpec

ROLES = ("dp", "zero", "tp")

# What a placement on one axis must be: None (anything), "R", "S" (any Shard) or "S0".
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
    if want == "S0":
        return placement == Shard(0)
    return isinstance(placement, Shard)


def _storage_wants(spec: TensorSpec, roles: Sequence[str]) -> tuple[Want, ...]:
    by_role = {"dp": "R", "zero": "S", "tp": "S" if spec.ndim >= 2 else None}
    return tuple(by_role[role] for role in roles)


def _read_wants(spec: TensorSpec, roles: Sequence[str]) -> tuple[Want, ...]:
    by_role = {"dp": "R", "zero": "R", "tp": "S" if spec.ndim >= 2 else None}
    return tuple(by_role[role] for role in roles)


def _input_wants(spec: TensorSpec, roles: Sequence[str], mesh: Mesh) -> tuple[Want, ...]:
    # The batch is cut over the data-parallel axes in order, outer first, as long as the
    # pieces divide it; an axis it no longer divides reads the input whole.
    wants: list[Want] = []
    pieces = 1
    for role, size in zip(roles, mesh.shape):
        if role != "tp" and spec.ndim and spec.shape[0] % (pieces * size) == 0:
            wants.append("S0")
            pieces *= size
        else:
            wants.append("R")
    return tuple(wants)


def _keep_storage(candidates: tuple[Strategy, ...], wants: tuple[Want, ...]) -> list[Strategy]:
    kept = list(candidates)
    for axis, want in enumerate(wants):
        narrowed = [s for s in kept if _ok(s.output[axis], want)]
        # Stored split where some dim divides, else replicated: that is the definition.
        kept = narrowed or [s for s in kept if _ok(s.output[axis], "R")]
    return kept


def _keep_op(candidates: tuple[Strategy, ...],
             wants: tuple[tuple[int, tuple[Want, ...]], ...]) -> list[Strategy]:
    return [s for s in candidates
            if all(_ok(s.inputs[position][axis], want)
                   for position, per_axis in wants for axis, want in enumerate(per_axis))]


def _check_roles(roles: Sequence[str], mesh: Mesh) -> tuple[str, ...]:
    roles = tuple(roles)
    if len(roles) != mesh.ndim or any(role not in ROLES for role in roles):
        raise ShardingError("a hand strategy needs one role per mesh axis",
                            expected=f"{mesh.ndim} of {ROLES}", got=repr(roles),
                            fix=f"e.g. {('dp',) * mesh.ndim}")
    return roles


def restrict(gm: fx.GraphModule, table: StrategyTable, mesh: Mesh,
             roles: Sequence[str]) -> Restriction:
    """`table` cut down to the strategies allowed by `roles` (one of `ROLES` per mesh axis,
    see the module docstring). Axes of one device are never restricted. Nodes whose
    strategy tuples are shared (identical ops) share the restricted tuple too, so the
    problem pass still recognises repeated blocks."""
    roles = _check_roles(roles, mesh)
    free_axes = tuple(size == 1 for size in mesh.shape)
    by_name = {node.name: node for node in gm.graph.nodes}

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
        key = (id(candidates), kind, wants)
        if key not in cache:
            if not wants or kind == "output":
                cache[key] = candidates
            else:
                kept = (_keep_storage(candidates, wants) if kind == "storage"
                        else _keep_op(candidates, wants))
                cache[key] = tuple(kept) if kept else None
        kept = cache[key]
        if kept is None:
            relaxed.append(name)
            kept = candidates
        strategies[name] = kept
    return Restriction(StrategyTable(strategies, table.inputs, table.unsupported),
                       tuple(relaxed))
