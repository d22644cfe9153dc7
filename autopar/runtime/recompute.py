"""`Recompute`: compute an op's output again in the backward instead of keeping it.

The plan marks some ops `recompute` (`NodePlan.recompute`): their outputs must not stay alive
for the backward. The lowering calls each such op through a `Recomputed` module, which runs
the op and hands its outputs to the program's `Recompute` scope together with a recipe:

- the op's callable and its non-tensor (local) arguments;
- per tensor input, where its value comes from in the backward: a handle into the output of
  another recomputed op (rebuilt too, recursively), a `Regather` handle (a regathered
  parameter: the one backward gather serves the recompute and the op's own backward, as the
  plan charges a single backward all-gather there), or the tensor before the edge's
  collective, kept; then the edge's forward steps, run again and counted on the
  `CommCounter` as backward collectives (the plan lists them a second time, backward=True).

Inside the scope (torch saved-tensor hooks), whenever autograd saves a tensor whose storage
is that of a recomputed output (the output itself, a view of it, or an output the op saves
for its own backward, as softmax or attention do), it keeps a handle with the view geometry
instead. The first unpack in a backward pass rebuilds the op's outputs from the recipe under
no_grad; the rebuilt outputs are kept until the last handle of the pass has been unpacked,
then dropped, so the op runs once per backward pass however many saved tensors point into it.

Contract: enter the scope around the forward of the program (`ParallelModule` does), and
give it the program's `Regather` scope, whose tensors it then handles too (only the innermost
saved-tensor hooks are active, so one scope must do both). A recipe keeps no recomputed output
alive: its inputs are handles where they are recomputed outputs. A recomputed op whose output
no backward step saves is never rebuilt, and its inputs are released with the output.
Nothing here is thread-safe.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.utils import _pytree as pytree

from autopar.runtime.axis_ops import apply_steps
from autopar.runtime.counter import CommCounter
from autopar.runtime.regather import Regather
from autopar.runtime.steps import Step


@dataclass(frozen=True)
class _Handle:
    """A saved tensor that is (a view of) output `index` of a recomputed op: its geometry,
    the offset taken from the start of that output's storage offset."""

    source: _Source
    index: int
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class _Input:
    """How a recipe obtains one tensor input of its op in the backward: `value` (a kept
    tensor, this scope's `_Handle` or a Regather handle), then `steps` run again."""

    value: object
    steps: tuple[Step, ...] = ()
    mesh: DeviceMesh | None = None
    counter: CommCounter | None = None
    version: int | None = None  # of a kept tensor, which must not change before the backward


@dataclass(frozen=True)
class _Recipe:
    """An op call: `fn(*args, **kwargs)` with `(args, kwargs)` = `spec` over `leaves`, whose
    positions `slots` take the tensor inputs."""

    fn: Callable
    spec: pytree.TreeSpec
    leaves: tuple
    slots: tuple[int, ...]
    inputs: tuple[_Input, ...]


class _Source:
    """One recomputed op's outputs in the backward; shared by every handle into them."""

    def __init__(self, recipe: _Recipe, scope: Recompute) -> None:
        self.recipe, self.scope = recipe, scope
        self.packed = 0  # handles made in the forward
        self._pending = 0  # handles not yet unpacked in this backward pass
        self._outputs: tuple | None = None

    def pack(self) -> None:
        self.packed += 1
        self._pending += 1

    def unpack(self) -> tuple:
        # Rebuild once per backward pass: keep the outputs until the last handle of the pass
        # has been unpacked, then let the unpacked views alone hold them.
        if self._outputs is None:
            self._outputs = self.scope._rebuild(self.recipe)
        outputs = self._outputs
        self._pending -= 1
        if self._pending <= 0:
            self._outputs, self._pending = None, self.packed  # a retained graph may run again
        return outputs


def _plain(tensor) -> bool:
    # Only plain dense tensors have a storage to recognise (subclasses may have none).
    return (type(tensor) in (torch.Tensor, nn.Parameter) and tensor.layout is torch.strided
            and tensor.device.type != "meta" and tensor.untyped_storage().nbytes() > 0)


def _outputs(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class _Box:
    """A tensor saved while a recomputed op runs, decided on once its outputs are known."""

    __slots__ = ("content",)

    def __init__(self, content) -> None:
        self.content = content


class Recompute(torch.autograd.graph.saved_tensors_hooks):
    """Saved-tensor hooks that replace recomputed outputs by handles (see module doc).

    `regather`: the program's Regather scope, whose tensors this scope hands to it. A plain
    object owned by the program; reusable across steps.
    """

    def __init__(self, regather: Regather | None = None) -> None:
        self.regather = regather
        # storage data_ptr -> (source, output index, the output's storage offset)
        self._outputs: dict[int, tuple[_Source, int, int]] = {}
        self._boxes: list[_Box] | None = None
        super().__init__(self._pack, self._unpack)

    def run(self, fn: Callable, args: tuple, kwargs: dict,
            inputs: tuple[tuple[object, object, tuple[Step, ...]], ...],
            mesh: DeviceMesh | None, counter: CommCounter | None):
        """`fn(*args, **kwargs)`, its outputs marked as recomputed.

        `inputs` lists, for each tensor input in the order of `pytree.tree_leaves((args,
        kwargs))`'s tensors, (value the op reads, value before the edge's collective, the
        edge's forward steps); `mesh` and `counter` run and count those steps again.
        """
        leaves, spec = pytree.tree_flatten((args, kwargs))
        slots = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor))
        assert len(slots) == len(inputs), (len(slots), len(inputs))
        self._boxes = boxes = []
        try:
            out = fn(*args, **kwargs)
        finally:
            self._boxes = None
        recipe = _Recipe(fn, spec, tuple(None if i in slots else leaf
                                         for i, leaf in enumerate(leaves)), slots,
                         tuple(self._input(post, pre, steps, mesh, counter)
                               for post, pre, steps in inputs))
        source = _Source(recipe, self)
        # An output that aliases an input (an op returning its argument) is kept anyway.
        taken = {t.untyped_storage().data_ptr() for post, pre, _ in inputs
                 for t in (post, pre) if isinstance(t, torch.Tensor) and _plain(t)}
        for index, tensor in enumerate(_outputs(out)):
            if not isinstance(tensor, torch.Tensor) or not _plain(tensor):
                continue
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key in taken:
                continue
            self._outputs[key] = (source, index, tensor.storage_offset())
            # Forget the entry when the storage dies (views may outlive the output tensor;
            # torch keeps a storage's Python object while the storage lives), before its
            # address can be reused.
            weakref.finalize(storage, self._forget, key, source)
        for box in boxes:  # what the op saved for its own backward, outputs included
            box.content = self._pack_now(box.content)
        return out

    def _input(self, post, pre, steps: tuple[Step, ...], mesh, counter) -> _Input:
        if post is not pre and self.regather is not None and _plain(post):
            held = self.regather.pack(post)
            if held is not post:  # a regathered parameter: its backward gather serves both
                return _Input(held)
        assert isinstance(pre, torch.Tensor), type(pre)
        if _plain(pre):
            handle = self._handle(pre)
            if handle is not None:
                return _Input(handle, steps, mesh, counter)
        return _Input(pre.detach(), steps, mesh, counter, pre._version)

    def _forget(self, key: int, source: _Source) -> None:
        entry = self._outputs.get(key)
        if entry is not None and entry[0] is source:
            del self._outputs[key]

    def _handle(self, tensor: torch.Tensor) -> _Handle | None:
        entry = self._outputs.get(tensor.untyped_storage().data_ptr())
        if entry is None:
            return None
        source, index, base = entry
        source.pack()
        return _Handle(source, index, tensor.size(), tensor.stride(),
                       tensor.storage_offset() - base)

    def _pack(self, tensor: torch.Tensor):
        if self._boxes is not None:  # inside a recomputed op: its outputs are not known yet
            box = _Box(tensor)
            self._boxes.append(box)
            return box
        return self._pack_now(tensor)

    def _pack_now(self, tensor: torch.Tensor):
        if not _plain(tensor):
            return tensor
        handle = self._handle(tensor)
        if handle is not None:
            return handle
        return self.regather.pack(tensor) if self.regather is not None else tensor

    def _unpack(self, saved):
        if isinstance(saved, _Box):
            saved = saved.content
        if isinstance(saved, torch.Tensor):
            return saved
        if isinstance(saved, _Handle):
            return self._view(saved)
        return self.regather.unpack(saved)

    @staticmethod
    def _view(handle: _Handle) -> torch.Tensor:
        full = handle.source.unpack()[handle.index]
        # The rebuilt output has the layout of the original, so the view's geometry applies.
        return full.as_strided(handle.size, handle.stride,
                               full.storage_offset() + handle.offset)

    def _value(self, item: _Input) -> torch.Tensor:
        value = item.value
        if isinstance(value, _Handle):
            value = self._view(value)
        elif isinstance(value, torch.Tensor):
            if value._version != item.version:
                raise RuntimeError(
                    "a tensor kept to recompute an op was modified in place after the "
                    "forward; recompute ops that read it, or do not modify it before the "
                    "backward")
        else:
            value = self.regather.unpack(value)
        if item.steps:
            value = apply_steps(value, item.steps, item.mesh, item.counter, "backward")
        return value

    def _rebuild(self, recipe: _Recipe) -> tuple:
        with torch.no_grad():
            leaves = list(recipe.leaves)
            for slot, item in zip(recipe.slots, recipe.inputs):
                leaves[slot] = self._value(item)
            args, kwargs = pytree.tree_unflatten(leaves, recipe.spec)
            return _outputs(recipe.fn(*args, **kwargs))


class Recomputed(nn.Module):
    """One recomputed op of a rank program, so that its code names it:
    `gelu = self.gelu__recompute(linear__R_S1, linear)`.

    Called with the values the op reads (after their edges' collectives) followed by the
    values before those collectives; `steps[i]` are the forward steps of input i's edge
    (empty without one). Runs `fn` over `leaves` (the op's flattened (args, kwargs), None
    where `slots` put the inputs) and marks its outputs in `scope` (see `Recompute.run`);
    without gradients it simply runs the op. Holds no state.
    """

    def __init__(self, fn: Callable, spec: pytree.TreeSpec, leaves: tuple,
                 slots: tuple[int, ...], steps: tuple[tuple[Step, ...], ...],
                 scope: Recompute, mesh: DeviceMesh | None,
                 counter: CommCounter | None) -> None:
        super().__init__()
        assert len(slots) == len(steps), (slots, steps)
        self.fn, self.spec, self.leaves, self.slots = fn, spec, leaves, slots
        self.steps, self.scope, self.mesh, self.counter = steps, scope, mesh, counter

    def forward(self, *values):
        posts, pres = values[:len(self.slots)], values[len(self.slots):]
        leaves = list(self.leaves)
        for slot, value in zip(self.slots, posts):
            leaves[slot] = value
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        if not torch.is_grad_enabled():
            return self.fn(*args, **kwargs)
        inputs = tuple((post, pre, steps) for post, pre, steps in zip(posts, pres, self.steps)
                       if isinstance(post, torch.Tensor))
        return self.scope.run(self.fn, args, kwargs, inputs, self.mesh, self.counter)

    def extra_repr(self) -> str:
        return f"{getattr(self.fn, '__name__', self.fn)}, recomputed in the backward"
