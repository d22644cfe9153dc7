"""trace_kernels: the kernels each op runs, forward and backward, as a CPU runs them.

Reads `autopar_tensor`, `autopar_bytes` and the gradient path of an annotated graph;
writes `autopar_kernels` (`Kernels`) on every op it could trace. Only a CPU profile's
costs read them: `priced_kernels` traces a graph the first time it prices one of its
ops for a CPU (`ensure_traced`), so that plans for other devices and compiles with a plan
never pay for it.

The rules price an op as one kernel moving its inputs and output; on a CPU, composite ops
decompose above autograd (an RMS norm's forward is a power, a mean, an add, a reciprocal
square root and two products; its backward is fourteen kernels), the backward of an op the
rules count as free can run kernels (a slice's is a zero fill and a copy, an expand's a
sum), and autograd sums the gradients of an output read more than once (one add per use
beyond the first). Each op is run once on fake tensors of its example shapes (no memory, no
compute) under a dispatch mode that counts the kernels autograd and the decompositions
reach, and the bytes each reads and writes, forward, then backward from a gradient of every
floating output to every input on the gradient path. Ops with the same target, input
shapes and arguments share one trace.

Only CPU fake tensors can be made on every machine (a CUDA fake tensor needs a CUDA build),
and CUDA has fused kernels for most composite ops: the cost model uses the traces for
profiles of CPU devices (`HardwareProfile.device`), the rules' single kernel otherwise.
An op that can't run on fake tensors (data-dependent shapes, an op without a backward
formula) keeps no trace, and is priced by the rules.
"""

from __future__ import annotations

import dataclasses

import sympy
import torch
import torch.utils._pytree as pytree
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from autopar.passes.capturing.annotate import size_hints
from autopar.passes.capturing.gradient_path import gradient_path, tensor_outputs
from autopar.values.specs import BYTES, KERNELS, TENSOR, Kernels, Size, TensorSpec

aten = torch.ops.aten

# `gm.meta` key: the graph's ops have been traced (those that could be).
TRACED = "autopar_kernels_traced"

# Ops that launch no kernel: allocations that write nothing yet, aliases, metadata.
_FREE = frozenset({
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
    aten.new_empty.default, aten.new_empty_strided.default, aten.detach.default,
    aten.alias.default, aten._unsafe_view.default, aten.lift_fresh.default,
    torch.ops.prim.device.default,
})


class _Counter(TorchDispatchMode):
    """Counts the kernels dispatched under it and the bytes of their tensor inputs and
    outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels, self.nbytes = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view and func not in _FREE:
            self.kernels += 1
            self.nbytes += sum(t.numel() * t.element_size()
                               for t in pytree.tree_leaves((args, kwargs, out))
                               if isinstance(t, torch.Tensor))
        return out


def reference_bytes(node: fx.Node) -> Size:
    """The bytes a node's `Kernels` are multiples of: its `autopar_bytes`, or its first
    tensor output's where the rules count it as moving none."""
    nbytes = node.meta.get(BYTES, 0)
    if nbytes != 0:
        return nbytes
    outputs = tensor_outputs(node)
    return outputs[0].sym_nbytes if outputs else 0


def priced_kernels(node: fx.Node, device: str) -> tuple[Kernels | None, Size]:
    """What the cost model prices `node` by on a profile of `device` (module docstring):
    on a CPU, its trace and `reference_bytes` (its graph traced on first use); else (or
    untraced) no trace and its `autopar_bytes`."""
    if device == "cpu" and node.graph.owning_module is not None:
        ensure_traced(node.graph.owning_module)
    kernels = node.meta.get(KERNELS) if device == "cpu" else None
    if kernels is None:
        return None, node.meta.get(BYTES, 0)
    return kernels, reference_bytes(node)


def ensure_traced(gm: fx.GraphModule) -> None:
    """`trace_kernels` on `gm` unless it was traced: a graph folded, split into stages or
    otherwise made from a traced one keeps its traces, so trace the graph they come from
    before (autograd's sums of gradients depend on an op's users in the whole graph)."""
    if not gm.meta.get(TRACED):
        trace_kernels(gm, size_hints(gm))


def trace_kernels(gm: fx.GraphModule, hints: dict) -> fx.GraphModule:
    """Write `autopar_kernels` on every op of `gm` that runs on fake CPU tensors and has
    none yet (one copied from the graph `gm` was made from stays), and mark `gm` traced
    (in place; returns `gm`); `hints` map the graph's size symbols to the example's sizes
    (`annotate.size_hints`)."""
    gm.meta[TRACED] = True
    on_path = gradient_path(gm)
    traced: dict[tuple, Kernels | None] = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        for node in gm.graph.nodes:
            if node.op != "call_function" or not tensor_outputs(node) or KERNELS in node.meta:
                continue
            key = _signature(node, on_path)
            if key is None:
                continue
            if key not in traced:
                traced[key] = _trace(node, on_path, hints)
            if traced[key] is not None:
                node.meta[KERNELS] = _with_gradient_sums(traced[key], node, on_path, hints)
    return gm


def _with_gradient_sums(kernels: Kernels, node: fx.Node, on_path: dict[str, bool],
                        hints: dict) -> Kernels:
    """`kernels` with what autograd adds to the backward where `node`'s output is read
    more than once on the gradient path: the gradients of its uses summed, one add
    (reading two, writing one) per use beyond the first."""
    uses = sum(arg is node for user in node.users if on_path.get(user.name, False)
               for arg in pytree.tree_leaves((user.args, user.kwargs)))
    if not on_path.get(node.name, False) or uses < 2:
        return kernels
    output = _at(tensor_outputs(node)[0].sym_nbytes, hints)
    extra = (uses - 1) * 3 * output / _at(reference_bytes(node), hints)
    return dataclasses.replace(kernels, backward=kernels.backward + uses - 1,
                               backward_bytes=kernels.backward_bytes + extra)


def _at(size: Size, hints: dict) -> float:
    """`size` at the example's sizes."""
    return float(sympy.sympify(size).subs(hints))


def _signature(node: fx.Node, on_path: dict[str, bool]) -> tuple | None:
    """What a trace depends on: the target, each input's shape, dtype and whether it takes
    a gradient, and the other arguments; None where an input is not a plain tensor."""
    parts = []
    for arg in pytree.tree_leaves((node.args, node.kwargs)):
        if isinstance(arg, fx.Node):
            spec = arg.meta.get(TENSOR)
            if not isinstance(spec, TensorSpec):
                return None
            parts.append((spec.shape, spec.dtype, on_path.get(arg.name, False)))
        elif isinstance(arg, (torch.SymInt, torch.SymFloat, torch.Tensor)):
            return None
        else:
            parts.append(repr(arg))
    return (node.target, tuple(parts), pytree.tree_structure((node.args, node.kwargs)))


def _trace(node: fx.Node, on_path: dict[str, bool], hints: dict) -> Kernels | None:
    """The kernels `node` runs on fake CPU tensors of its inputs' shapes, forward and then
    backward (see the module docstring); `hints` give the graph's symbolic sizes their
    example values."""
    leaves: list[torch.Tensor] = []

    def fake(arg):
        if not isinstance(arg, fx.Node):
            return arg
        spec = arg.meta[TENSOR]
        value = torch.empty(spec.shape, dtype=spec.dtype, device="cpu")
        if on_path.get(arg.name, False) and (spec.dtype.is_floating_point
                                             or spec.dtype.is_complex):
            value.requires_grad_(True)
            leaves.append(value)
        return value

    reference = _at(reference_bytes(node), hints)
    if not reference > 0:
        return None
    try:
        args, kwargs = fx.node.map_aggregate((node.args, node.kwargs), fake)
        forward, backward = _Counter(), _Counter()
        with forward:
            out = node.target(*args, **kwargs)
        outputs = [t for t in pytree.tree_leaves(out)
                   if isinstance(t, torch.Tensor) and t.requires_grad]
        if leaves and outputs:
            grads = [torch.ones_like(t) for t in outputs]
            with backward:
                torch.autograd.grad(outputs, leaves, grads, allow_unused=True)
    # An op that fake tensors can't run (data-dependent output shapes, no backward
    # formula, an argument the trace can't rebuild) is priced by its rule instead.
    except Exception:  # noqa: BLE001
        return None
    return Kernels(forward.kernels, backward.kernels, forward.nbytes / reference,
                   backward.nbytes / reference)

