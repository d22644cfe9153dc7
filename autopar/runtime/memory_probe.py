"""What one rank really holds: training state after a step, and what autograd keeps at the
end of the forward. The measured side of `autopar.tools.predicted_memory.predicted_memory`.

`state_bytes(module, optimizer)`, after `optimizer.step()` and before `zero_grad()`:
exact bytes of the rank's parameter pieces, their `.grad`, and the tensors in
`optimizer.state`, each storage counted once (tied names share a piece). Gradients are
given twice: `gradients`, the bytes of the gradient tensors themselves (elements x item
size: what the cost model counts), and `gradient_storages`, the bytes of the storages they
live in (what is held: a `.grad` that is a view of a larger buffer keeps all of it). Optimizer state
tensors shaped like their parameter are `optimizer_states` (what the cost model counts);
the others (AdamW's 0-d `step` counters, 4 bytes per parameter) are `optimizer_scalars`,
reported apart because the model does not count them.

`ForwardProbe(pm)`: a context manager around one forward of a `ParallelModule`. Inside it
every tensor autograd saves for the backward passes through the probe, and at its exit (the
end of the forward, before the backward) it records the bytes of the distinct storages
still held for the backward (`SavedBytes`):

- How it sees the real saved storages. Only the innermost saved-tensor hooks are active
  (torch keeps a stack and calls the top pair only: an outer hook sees nothing an inner
  scope packs). The rank program runs inside its own scope (`Recompute` or `Regather`),
  which packs regathered and recomputed tensors as small handles. So the probe replaces
  that scope for the call by a pair of hooks that calls the program's own pack hook and
  records what it returns: exactly what autograd stores. A plain tensor is held as is; a
  `Regather` handle holds the parameter's local shard; a `Recompute` handle (or the box a
  recomputed op's own saves are first packed into) holds what its recipe keeps to rebuild
  the op: kept input tensors, other handles (followed recursively) and shards.
- What counts as held: a packed object autograd still references at the end of the
  forward (Python reference count above the probe's own: an op whose graph was dropped in
  the forward released its saved tensors). Each storage is counted once, at its whole size
  (`untyped_storage().nbytes()`: a saved view holds its base).
- Classification of a held storage, in this order: the storage of one of the rank's
  parameter pieces (a weight or a view of it: `parameters`, already counted in
  `state_bytes`); the output of one of the program's collectives (their storages are kept
  alive until the exit, so that no other tensor takes their address) whose input is a
  parameter piece (a gathered copy kept for the backward, ZeRO-2: `gathered`); a buffer or
  constant piece, or a collective's output of one (`buffers`); a user input given to the
  forward, or a collective's output of one (its piece: `inputs`); anything else
  (`activations`): op outputs and collective outputs of activations.

Saved tensors the hooks never see are not measured: tensors stored as attributes of a
custom `autograd.Function`'s ctx (not `save_for_backward`), and memory an op keeps outside
autograd. autopar's own Functions save through `save_for_backward` or keep no tensor.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from autopar.runtime.collectives import Collective


@dataclass(frozen=True)
class StateBytes:
    """Bytes of training state one rank holds (see the module docstring)."""

    parameters: int
    gradients: int
    gradient_storages: int
    optimizer_states: int
    optimizer_scalars: int
    buffers: int


@dataclass(frozen=True)
class SavedBytes:
    """Bytes of distinct storages autograd holds for the backward at the end of the forward,
    by class (see the module docstring); `tensors`: saved objects seen, `storages`: distinct
    storages held."""

    activations: int
    gathered: int
    parameters: int
    buffers: int
    inputs: int
    tensors: int
    storages: int


def _key(tensor: torch.Tensor) -> int | None:
    """The data pointer of `tensor`'s storage; None for tensors without one (meta,
    subclasses that hold no data of their own, empty storages)."""
    if type(tensor) not in (torch.Tensor, nn.Parameter) or tensor.layout is not torch.strided \
            or tensor.device.type == "meta":
        return None
    storage = tensor.untyped_storage()
    return storage.data_ptr() if storage.nbytes() else None


def _distinct_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        key = _key(t)
        if key is not None:
            seen[key] = t.untyped_storage().nbytes()
    return sum(seen.values())


def state_bytes(module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> StateBytes:
    """Exact bytes of `module`'s parameters, their gradients, its buffers, and the tensors of
    `optimizer.state` (each storage once). Call after `optimizer.step()`, before
    `zero_grad()` (which frees the gradients)."""
    params = list(module.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    shaped, scalars = [], []
    if optimizer is not None:
        for param, state in optimizer.state.items():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    (shaped if value.shape == param.shape and value.dim() > 0
                     else scalars).append(value)
    buffers = list(module.buffers()) + list(getattr(module, "_constants", {}).values())
    own = sum(g.numel() * g.element_size() for g in grads)
    return StateBytes(_distinct_bytes(params), own, _distinct_bytes(grads), _distinct_bytes(shaped),
                      _distinct_bytes(scalars), _distinct_bytes(buffers))


class _Hooks(torch.autograd.graph.saved_tensors_hooks):
    """The program's own saved-tensor hooks (or none), recording what they pack."""

    def __init__(self, inner: torch.autograd.graph.saved_tensors_hooks | None) -> None:
        self.inner = inner
        self.packed: list = []
        super().__init__(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor):
        packed = self.inner.pack_hook(tensor) if self.inner is not None else tensor
        self.packed.append(packed)
        return packed

    def _unpack(self, packed):
        return self.inner.unpack_hook(packed) if self.inner is not None else packed


class ForwardProbe:
    """Measures what autograd holds after one forward of `pm` (see the module docstring).

    Use as `with ForwardProbe(pm, inputs) as probe: loss = pm(*inputs)`, then read
    `probe.saved` (a `SavedBytes`, set at the exit). `inputs` are the user inputs given to
    the forward (their storages classify as inputs). Not reentrant; one forward per use.
    """

    def __init__(self, pm: nn.Module, inputs: Iterable = ()) -> None:
        self.pm = pm
        self.inputs = tuple(t for t in inputs if isinstance(t, torch.Tensor))
        self.saved: SavedBytes | None = None
        self._made: dict[int, str] = {}  # collective output storage -> class of its input
        # The storages of those outputs, kept alive until the exit: a freed one's address
        # could be reused by an activation, which `_made` would then misclassify.
        self._outputs: list = []
        self._handles: list = []

    def __enter__(self) -> ForwardProbe:
        pm = self.pm
        self._parameters = {k for k in map(_key, pm.parameters()) if k is not None}
        self._buffers = {k for k in map(_key, list(pm.buffers()) + list(
            getattr(pm, "_constants", {}).values())) if k is not None}
        self._inputs = {k for k in map(_key, self.inputs) if k is not None}
        for module in pm.modules():
            if isinstance(module, Collective):
                self._handles.append(module.register_forward_hook(self._collective))
        # ParallelModule.forward enters `_scope` around its program: put the recording hooks
        # there, wrapping the program's own, so that they are the innermost (active) pair.
        self._inner = pm._scope
        self._hooks = _Hooks(self._inner)
        pm._scope = self._hooks
        return self

    def _collective(self, module, args, output) -> None:
        source = _key(args[0]) if args and isinstance(args[0], torch.Tensor) else None
        made = _key(output) if isinstance(output, torch.Tensor) else None
        if source is None or made is None or made == source:
            return
        kind = ("gathered" if source in self._parameters else
                "buffers" if source in self._buffers else
                "inputs" if source in self._inputs else self._made.get(source))
        if kind is not None:
            self._made[made] = kind
            self._outputs.append(output.untyped_storage())

    def __exit__(self, *exc) -> None:
        self.pm._scope = self._inner
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        packed, self._hooks.packed = self._hooks.packed, []
        if exc[0] is None:
            self.saved = self._measure(packed)
        self._outputs.clear()

    def _measure(self, packed: list) -> SavedBytes:
        # Garbage in reference cycles waits for the collector, whose timing depends on
        # every allocation the process made before: collect it, measure what is held.
        gc.collect()
        # An object only the list references has the count of a fresh one in the same
        # expression (the list's reference, the loop variable's, getrefcount's argument:
        # how many depends on the Python version); one more is autograd's, or a live owner's.
        baseline = [sys.getrefcount(item) for item in [object()]][0]
        alive = [item for item in packed if sys.getrefcount(item) > baseline]
        held: dict[int, torch.Tensor] = {}
        for tensor in (t for item in alive for t in _held_tensors(item)):
            key = _key(tensor)
            if key is not None:
                held[key] = tensor
        totals = dict.fromkeys(("activations", "gathered", "parameters", "buffers", "inputs"),
                               0)
        for key, tensor in held.items():
            kind = ("parameters" if key in self._parameters else
                    "buffers" if key in self._buffers else
                    "inputs" if key in self._inputs else
                    self._made.get(key, "activations"))
            totals[kind] += tensor.untyped_storage().nbytes()
        return SavedBytes(**totals, tensors=len(alive), storages=len(held))


def _held_tensors(item, depth: int = 0) -> list[torch.Tensor]:
    """The tensors a packed object keeps alive: itself if a tensor, else what a Regather or
    Recompute handle (or a recomputed op's box) holds, recursively."""
    if isinstance(item, torch.Tensor):
        return [item]
    if depth > 64:  # handles chain through recipes; a cycle would be a bug elsewhere
        raise RuntimeError("saved-tensor handles nest deeper than 64")
    if hasattr(item, "content"):  # Recompute's box: what the op saved, decided after it ran
        return _held_tensors(item.content, depth + 1)
    source = getattr(item, "source", None)
    if source is None:
        return []
    if hasattr(source, "shard"):  # Regather: the local shard
        return [source.shard]
    recipe = getattr(source, "recipe", None)  # Recompute: what rebuilding the op needs
    found: list[torch.Tensor] = []
    for entry in recipe.inputs if recipe is not None else ():
        found.extend(_held_tensors(entry.value, depth + 1))
    return found


def measure_step(pm: nn.Module, optimizer: torch.optim.Optimizer, inputs: tuple
                 ) -> tuple[SavedBytes, StateBytes]:
    """One training step of `pm` on `inputs`, measured: what autograd holds at the end of
    the forward (`ForwardProbe`) and the state held after `optimizer.step()` (`state_bytes`).
    Leaves the gradients zeroed (set to None). Collective when `pm` is: every rank calls it."""
    with ForwardProbe(pm, inputs) as probe:
        loss = pm(*inputs)
    loss.backward()
    optimizer.step()
    state = state_bytes(pm, optimizer)
    optimizer.zero_grad()
    return probe.saved, state
