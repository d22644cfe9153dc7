"""Value types that describe a captured graph to the later passes.

`capture` and `annotate` write these into `node.meta`; the strategy, problem and plan passes
read them. Meta keys (all prefixed `autopar_`):

- `autopar_role` (capture): "parameter", "buffer", "constant", "input", "op" or "output".
- `autopar_names` (capture): for parameters, buffers and constants, every fully qualified
  name the tensor has in the model (tied weights have several), first one canonical.
- `autopar_frozen` (capture): True on a parameter the model does not train (its
  `requires_grad` is False, as a frozen embedding's): it has no gradient, optimizer state
  or optimizer step, and carries no gradient.
- `autopar_module` (capture): dotted path of the innermost module that produced the node
  ("" at top level), e.g. "layers.3.attn"; the unit for grouping and layer folding.
- `autopar_tensor` (annotate): the `TensorSpec` of the node's value, a tuple of them for a
  node with several tensor outputs (None in the positions that are not tensors), or None.
- `autopar_flops`, `autopar_bytes` (annotate): forward FLOPs and bytes moved (read + written)
  by the node on one device running it whole; an int, or a sympy expression over the graph's
  symbolic sizes.
- `autopar_kernels` (trace_kernels): the `Kernels` an op runs where composite ops
  decompose into their parts (a CPU), forward and backward; absent where it was not traced.
- `autopar_boundary` (split_stages): on the inputs of a pipeline stage's graph that the
  previous stage sends (role "input"; floating-point ones carry a gradient back).
- `autopar_sharded_outputs` (`capture.leave_outputs_sharded`): on the output node of a
  forward-only graph whose caller takes its outputs as the plan leaves them, split or not.

Graph meta (`gm.meta`):

- `autopar_fold` (fold_depth): the `Fold` of a graph whose repeated blocks stand for more
  blocks of the model's graph.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import sympy
import torch

ROLE = "autopar_role"
NAMES = "autopar_names"
FROZEN = "autopar_frozen"
MODULE = "autopar_module"
TENSOR = "autopar_tensor"
FLOPS = "autopar_flops"
BYTES = "autopar_bytes"
KERNELS = "autopar_kernels"
BOUNDARY = "autopar_boundary"
SHARDED_OUTPUTS = "autopar_sharded_outputs"
FOLD = "autopar_fold"

# A module path inside a block of a ModuleList: `<list>.<index>` then the rest, if any.
BLOCK = re.compile(r"^(?P<list>(?:[^.]+\.)*?[^.]+)\.(?P<index>\d+)(?:\.|$)")

Size = int | sympy.Expr


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one tensor value.

    `shape` holds concrete sizes (for a dynamic dim, the size of the example input);
    `sym_shape` holds the symbolic sizes when any dim is dynamic, else None.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    sym_shape: tuple[Size, ...] | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def sym_nbytes(self) -> Size:
        """Bytes as a sympy expression when symbolic, else the int."""
        if self.sym_shape is None:
            return self.nbytes
        return sympy.Mul(*self.sym_shape) * self.itemsize


@dataclass(frozen=True)
class Kernels:
    """The kernels one op runs, as traced on a device where composite ops decompose into
    their parts (an RMS norm's forward is six kernels on a CPU, its backward fourteen):
    how many in the forward and in the backward, and the bytes they read and write as
    multiples of the op's reference bytes (`trace_kernels.reference_bytes`: its
    `autopar_bytes`, or for an op the rules count as moving none, a view, its output's
    bytes), which scale with the op's size and sharding as the reference does."""

    forward: int
    backward: int
    forward_bytes: float
    backward_bytes: float


def module_of(node) -> str:
    """Module path of a node (`autopar_module`); for stored tensors, that of the module
    owning the canonical name."""
    names = node.meta.get(NAMES)
    if names:
        return names[0].rpartition(".")[0]
    return node.meta.get(MODULE, "")


@dataclass(frozen=True)
class Fold:
    """How a folded graph (`passes/problem/fold_depth.py`) stands for the graph it was folded from:
    each node of its representative block stands for the nodes at the same position in
    consecutive blocks, named `copies[node]` (itself first) and in modules `modules[node]`;
    `previous` maps each node of the block before the representative to the
    representative's node at the same position (copy k of a representative's node reads
    copy k - 1 where the representative reads that block); `order` is each node's position
    in the unfolded graph."""

    copies: Mapping[str, tuple[str, ...]]
    modules: Mapping[str, tuple[str, ...]]
    previous: Mapping[str, str]
    order: Mapping[str, int]

    def repeats(self, name: str) -> int:
        """How many nodes of the unfolded graph `name` stands for."""
        return len(self.copies.get(name, ((),)))

    def producer(self, name: str, consumer: str, copy: int) -> str:
        """The unfolded name of the node `name` that copy `copy` of `consumer` reads."""
        if consumer not in self.copies:
            return self.copies[name][-1] if name in self.copies else name
        if name in self.copies:
            return self.copies[name][copy]
        if name in self.previous and copy > 0:
            return self.copies[self.previous[name]][copy - 1]
        return name
