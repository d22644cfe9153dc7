"""`CompileOnCall`: `autopar.compile(model, mesh)` without example inputs, compiled at the
first call from that call's inputs, as torch.compile does.

Before the first call it holds the model's own parameters and buffers under the model's own
names, so the usual order works:

    pm = autopar.compile(model, mesh)
    optimizer = torch.optim.AdamW(pm.parameters())
    loss = pm(x, y)          # plans and compiles here (collective: every rank calls it)

Compiling hands each rank's piece to the *same* Parameter objects (`param.data` becomes the
piece), so an optimizer made before the first call steps the pieces; its states are created
at its first step, with the pieces' shapes.

A call whose inputs differ in shape or dtype from every compiled one compiles again for them,
with every parameter and buffer pinned to the placement it is stored in (so parameters and
optimizer states stay valid; only the activations' splits are chosen anew), and later calls
reuse whichever compiled program their inputs match. With `replan=False` (or a given plan)
such a call raises `InputMismatchError` instead. Calls take positional inputs only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from autopar.errors import InputMismatchError
from autopar.runtime.parallel_module import ParallelModule
from autopar.values.placement import format_placements

Compiler = Callable[[tuple, dict[str, str] | None], ParallelModule]
"""(example inputs, placements to pin by tensor name or None) -> this rank's module."""


def _signature(inputs: tuple) -> tuple:
    return tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else repr(x)
                 for x in torch.utils._pytree.tree_leaves(inputs))


class CompileOnCall(nn.Module):
    """A model compiled at its first call (see the module docstring). After that call,
    `plan`, `code`, `counter`, `full_state_dict()` and `full_grads()` are those of the
    program the latest call ran."""

    def __init__(self, model: nn.Module, compile_for: Compiler, *, replan: bool) -> None:
        super().__init__()
        # The model's own tensors under its own names: `parameters()` before the first call
        # are the ones compiling hands the pieces to.
        for name, child in model.named_children():
            self.add_module(name, child)
        for name, param in model._parameters.items():
            self.register_parameter(name, param)
        for name, buffer in model._buffers.items():
            self.register_buffer(name, buffer,
                                 persistent=name not in model._non_persistent_buffers_set)
        self._compile_for, self._replan = compile_for, replan
        self._compiled: dict[tuple, ParallelModule] = {}
        self._latest: ParallelModule | None = None

    def forward(self, *args, **kwargs):
        if kwargs:
            raise InputMismatchError(
                "a model compiled without example inputs takes positional inputs only",
                expected="pm(x, y, ...)", got=f"keyword arguments {sorted(kwargs)}",
                fix="pass the inputs positionally, in forward's order")
        key = _signature(args)
        compiled = self._compiled.get(key)
        if compiled is None:
            if self._latest is not None and not self._replan:
                return self._latest(*args)  # raises the InputMismatchError that says why
            compiled = self._compile(args)
            self._compiled[key] = compiled
        self._latest = compiled
        return compiled(*args)

    def _compile(self, inputs: tuple) -> ParallelModule:
        pinned = None
        if self._latest is not None:
            # The full values back into this module's tensors, to be split again.
            full = self._latest.full_state_dict()
            with torch.no_grad():
                for name, tensor in self._own_tensors().items():
                    if name in full:
                        tensor.data = full[name]
            pinned = {slot.names[0]: format_placements(slot.placements)
                      for slot in self._latest.slots if slot.role != "constant"}
        compiled = self._compile_for(inputs, pinned)
        compiled.adopt(self._own_tensors())
        return compiled

    def _own_tensors(self) -> dict[str, torch.Tensor]:
        tensors = dict(self.named_parameters(remove_duplicate=False))
        tensors.update(self.named_buffers(remove_duplicate=False))
        return tensors

    def _compiled_module(self) -> ParallelModule:
        if self._latest is None:
            raise InputMismatchError(
                "the model is compiled at its first call, which has not happened yet",
                expected="a call pm(*inputs) first", got="no call yet",
                fix="call the model once (every rank), or compile with example inputs")
        return self._latest

    @property
    def plan(self):
        return self._compiled_module().plan

    @property
    def code(self) -> str:
        return self._compiled_module().code

    @property
    def counter(self):
        return self._compiled_module().counter

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self._compiled_module().full_state_dict()

    def full_grads(self) -> dict[str, torch.Tensor | None]:
        return self._compiled_module().full_grads()
