"""`Regather`: gather a sharded parameter again for the backward instead of keeping it.

A parameter stored sharded (ZeRO-3/FSDP) is all-gathered before its use; the op that uses it
would normally keep the gathered copy alive until its backward. Inside a `Regather` scope
(torch saved-tensor hooks), whenever an op saves a tensor produced by a regather edge (or a
view of one), it keeps a small handle instead: the local shard plus the view geometry. When
the backward unpacks it, the shard is gathered again (recorded as backward all-gathers on the
counter, the repeat `formulas.edge_transfers(..., regather=True)` charges), once per backward
pass however many of the op's saved tensors point into it.

Contract: enter the scope around the forward of the code that consumes regathered tensors
and pass it to `redistribute(..., regather=scope)`. If no op saves the gathered tensor (its
other operands need no gradient), nothing is gathered again and the measured backward bytes
are lower than the charged ones by that gather.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh

from autopar.runtime.axis_ops import apply_steps
from autopar.runtime.counter import CommCounter
from autopar.runtime.steps import Step


class _Source:
    """How to rebuild one regathered tensor; shared by every handle that points into it."""

    def __init__(self, shard: torch.Tensor, steps: tuple[Step, ...], mesh: DeviceMesh,
                 counter: CommCounter, passes: int = 1) -> None:
        self.shard, self.steps, self.mesh, self.counter = shard, steps, mesh, counter
        self.passes = passes  # backward passes that unpack every handle (`Regather`)
        self.packed = 0  # handles made in the forward
        self._pending = 0  # handles not yet unpacked in this backward
        self._full: torch.Tensor | None = None

    def pack(self) -> None:
        self.packed += 1
        self._pending += self.passes

    def unpack(self) -> torch.Tensor:
        # Gather once per backward: keep the rebuilt tensor until the last handle of its
        # last pass has been unpacked, then let the saved views alone hold it.
        if self._full is None:
            with torch.no_grad():
                self._full = apply_steps(self.shard, self.steps, self.mesh, self.counter,
                                         "backward")
        full = self._full
        self._pending -= 1
        if self._pending <= 0:
            # A retained graph may run again.
            self._full, self._pending = None, self.packed * self.passes
        return full


@dataclass(frozen=True)
class _Handle:
    source: _Source
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


class Regather(torch.autograd.graph.saved_tensors_hooks):
    """Saved-tensor hooks that replace regathered tensors by their shards (see module doc).

    A plain object owned by the caller; reusable across steps; not thread-safe.
    """

    def __init__(self, backward_passes: int = 1) -> None:
        # A schedule that splits each backward into an input pass and a weight pass runs
        # the saving ops' backward nodes twice (`backward_passes` 2): the gathered tensor
        # is kept from the first to the second, so the backward gathers it once, as
        # `formulas.edge_transfers(..., regather=True)` charges.
        self.backward_passes = backward_passes
        self._sources: dict[int, tuple[weakref.ref, _Source]] = {}
        super().__init__(self.pack, self.unpack)

    def track(self, gathered: torch.Tensor, shard: torch.Tensor, steps: tuple[Step, ...],
              mesh: DeviceMesh, counter: CommCounter) -> None:
        """Mark `gathered` (made from `shard` by `steps`) as rebuildable from the shard."""
        key = gathered.untyped_storage().data_ptr()
        assert key != shard.untyped_storage().data_ptr(), "regathered tensor aliases its shard"
        self._sources[key] = (weakref.ref(gathered), _Source(shard.detach(), steps, mesh,
                                                             counter, self.backward_passes))
        # Forget the entry when the gathered tensor dies, before its address can be reused.
        weakref.finalize(gathered, self._sources.pop, key, None)

    def pack(self, tensor: torch.Tensor):
        """The pack hook: a handle for a regathered tensor or a view of one, else `tensor`
        itself. A handle counts as one unpack due in the backward (`Recompute` takes some
        for the ops it recomputes)."""
        # Only plain dense tensors can alias a gathered buffer (subclasses may lack storage).
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or \
                tensor.layout is not torch.strided or tensor.device.type == "meta":
            return tensor
        entry = self._sources.get(tensor.untyped_storage().data_ptr())
        if entry is None or entry[0]() is None:
            return tensor
        source = entry[1]
        source.pack()
        return _Handle(source, tensor.size(), tensor.stride(), tensor.storage_offset())

    @staticmethod
    def unpack(saved):
        """The unpack hook: the tensor `pack` was given, rebuilt if it returned a handle."""
        if isinstance(saved, torch.Tensor):
            return saved
        full = saved.source.unpack()
        # The rebuilt tensor has the layout of the original, so the view's geometry applies.
        return full.as_strided(saved.size, saved.stride, saved.offset)
