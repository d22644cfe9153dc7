"""A rank's local pieces of a model's state, from real tensors or from the meta device.

For a model with real tensors each rank slices its pieces out of its own copy, so every rank
must hold the same values (build the model under the same `torch.manual_seed`, or load the
same checkpoint). For a model built on the meta device, the tensors are created one owning
module at a time: a copy of the module gets empty tensors on the rank's device and its
`reset_parameters()` (which every torch.nn layer defines) fills them, the rank keeps its
pieces and drops the rest. Peak memory is one module's state, and ranks seeded alike draw
the same values. A module holding meta tensors without `reset_parameters()` raises
`InitializationError` (buffers computed in a constructor, like rotary tables, are lost on
the meta device: build those on a real one).
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from autopar.errors import InitializationError
from autopar.runtime.program import StateSlot
from autopar.runtime.shards import local_piece
from autopar.values.placement import Replicate, Shares


def state_slots(model: nn.Module, graph_state: tuple[StateSlot, ...],
                mesh_ndim: int) -> tuple[StateSlot, ...]:
    """`graph_state`, then the model's parameters and buffers the graph never reads, kept
    whole (replicated) so that the state dict stays complete."""
    replicated = tuple(Replicate() for _ in range(mesh_ndim))
    seen = {name for slot in graph_state for name in slot.names}
    trained = dict(model.named_parameters(remove_duplicate=False))
    graph_state = tuple(
        dataclasses.replace(slot, requires_grad=trained[slot.names[0]].requires_grad)
        if slot.role == "parameter" else slot for slot in graph_state)
    extra: dict[int, StateSlot] = {}
    for role, named in (("parameter", model.named_parameters(remove_duplicate=False)),
                        ("buffer", model.named_buffers(remove_duplicate=False))):
        for name, tensor in named:
            if name in seen:
                continue
            slot = extra.get(id(tensor))
            extra[id(tensor)] = StateSlot(
                (*(slot.names if slot else ()), name), role, tuple(tensor.shape), tensor.dtype,
                replicated, requires_grad=tensor.requires_grad)
    return (*graph_state, *extra.values())


class _Materializer:
    """Full values of meta tensors on `device`, one owning module at a time (the last
    module's values are kept until a tensor of another module is asked for)."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.owner: str | None = None
        self.values: dict[str, torch.Tensor] = {}

    def full(self, name: str) -> torch.Tensor:
        prefix, _, leaf = name.rpartition(".")
        if prefix != self.owner:
            self.owner, self.values = prefix, self._initialise(prefix)
        return self.values[leaf]

    def _initialise(self, prefix: str) -> dict[str, torch.Tensor]:
        module = self.model.get_submodule(prefix)
        if not callable(getattr(module, "reset_parameters", None)):
            raise InitializationError(
                f"module {prefix or '<root>'!r} ({type(module).__name__}) holds meta tensors "
                "but has no reset_parameters() to initialise them",
                expected="meta tensors only in modules with reset_parameters(), as in torch.nn",
                got=f"{type(module).__name__} without reset_parameters",
                fix="define reset_parameters() on it, or build those tensors on a real device")
        # A shallow copy with its own tensor dicts: the model keeps its meta tensors.
        clone = copy.copy(module)
        clone._parameters, clone._buffers = dict(module._parameters), dict(module._buffers)
        clone.to_empty(device=self.device, recurse=False)
        with torch.no_grad():
            clone.reset_parameters()
        return {k: v for k, v in (*clone._parameters.items(), *clone._buffers.items())
                if v is not None}


def local_pieces(model: nn.Module, slots: tuple[StateSlot, ...],
                 constants: dict[str, torch.Tensor], mesh_shape: tuple[int, ...],
                 coordinate: tuple[int, ...], device: torch.device,
                 shares: Shares = None) -> dict[str, torch.Tensor]:
    """This rank's piece of every slot, by canonical name (see the module docstring), on a
    mesh of `mesh_shape` cut by `shares`; meta tensors are created on `device`."""
    materializer = _Materializer(model, device)
    pieces = {}
    # Grouped by owning module, so that each module is initialised once.
    owners: dict[str, list[StateSlot]] = {}
    for slot in slots:
        owners.setdefault(slot.names[0].rpartition(".")[0], []).append(slot)
    for slot in (s for group in owners.values() for s in group):
        name = slot.names[0]
        if slot.role == "constant":
            full = constants[name]
        elif slot.role == "parameter":
            full = model.get_parameter(name)
        else:
            full = model.get_buffer(name)
        if full.is_meta:
            full = materializer.full(name)
        pieces[name] = local_piece(full, slot.placements, mesh_shape, coordinate, shares)
    return pieces
