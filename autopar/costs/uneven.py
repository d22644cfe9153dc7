"""The bytes of a tensor that some split cuts unevenly.

A split follows DTensor's chunking (`autopar.values.placement`): a dim of s cut in n holds
pieces of ceil(s / n), the last ones shorter. Rank 0 holds the largest piece of every dim,
and the runtime sends uneven pieces padded to the largest (`autopar.runtime.axis_ops`), so
one rank's figures are rank 0's:

    piece      = itemsize x prod_d  local_d                   (rank 0's piece)
    collective = n x itemsize x prod_d  min(before_d, after_d)  (gather, scatter, all-to-all)
    all_reduce = piece before the step

with local_d, before_d, after_d the sizes of rank 0's piece of dim d (before and after the
step). Where every dim divides, these are the even formulas: nbytes / pieces, times n for
the larger side of a gather.

The cost model passes sizes around as numbers. `TensorBytes` is the number (the whole
tensor's bytes, an int) that also carries the shape, so that `piece_bytes` and
`buffer_bytes` can take rank 0's piece; `tensor_bytes` makes one only for a tensor some
split of the mesh cuts unevenly, and plain numbers keep the even formulas.
"""

from __future__ import annotations

import functools
import itertools
import math

from autopar.values.placement import Placements, Shard, local_shape
from autopar.values.specs import TensorSpec


class TensorBytes(int):
    """The bytes of a tensor of `shape` and `itemsize` (the int), whose pieces may differ."""

    shape: tuple[int, ...]
    itemsize: int

    def __new__(cls, shape: tuple[int, ...], itemsize: int) -> TensorBytes:
        value = super().__new__(cls, math.prod(shape) * itemsize)
        value.shape, value.itemsize = tuple(shape), itemsize
        return value

    # Two tensors of equal bytes but different shapes have different pieces: caches keyed
    # by sizes must tell them apart.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, TensorBytes):
            return int(self) == int(other) and self.shape == other.shape
        return int(self) == other

    def __hash__(self) -> int:
        return hash((int(self), self.shape))

    def __reduce__(self):
        return TensorBytes, (self.shape, self.itemsize)

    def __repr__(self) -> str:
        return f"TensorBytes({int(self)}, shape={self.shape})"


def tensor_bytes(spec: TensorSpec, mesh_shape: tuple[int, ...], *, symbolic: bool = False):
    """The size the cost model takes for the tensor `spec`: a `TensorBytes` where some set
    of the mesh's axes cuts one of its dims unevenly (and no dim is empty), else its bytes
    (with `symbolic`, a sympy expression where its shape is symbolic: a dynamic dim is
    never split unevenly)."""
    if spec.sym_shape is None and _uneven(tuple(spec.shape), tuple(mesh_shape)):
        return TensorBytes(spec.shape, spec.itemsize)
    return spec.sym_nbytes if symbolic else spec.nbytes


@functools.lru_cache(maxsize=1 << 14)
def _uneven(shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> bool:
    counts = {math.prod(axes) for k in range(1, len(mesh_shape) + 1)
              for axes in itertools.combinations(mesh_shape, k)}
    return all(shape) and any(size % n for size in shape for n in counts if 1 < n <= size)


def piece_bytes(nbytes: TensorBytes, placements: Placements, mesh_shape: tuple[int, ...]) -> int:
    """Bytes of rank 0's piece (the largest) of the tensor under `placements`."""
    return math.prod(local_shape(nbytes.shape, placements, mesh_shape)) * nbytes.itemsize


def imbalance(nbytes, placements: Placements, mesh_shape: tuple[int, ...]) -> float:
    """How much more than an even share of the tensor rank 0 holds under `placements`:
    its piece over nbytes / pieces (1 for a plain size)."""
    if not isinstance(nbytes, TensorBytes):
        return 1.0
    pieces = math.prod(n for p, n in zip(placements, mesh_shape) if isinstance(p, Shard))
    return piece_bytes(nbytes, placements, mesh_shape) * pieces / int(nbytes)


def buffer_bytes(nbytes: TensorBytes, kind: str, axis: int, before: Placements,
                 after: Placements, mesh_shape: tuple[int, ...]) -> int:
    """Rank 0's buffer B for one collective over `axis` turning `before` into `after`
    (module docstring): the larger side, uneven pieces padded to the largest."""
    first = local_shape(nbytes.shape, before, mesh_shape)
    if kind == "all_reduce":
        return math.prod(first) * nbytes.itemsize
    second = local_shape(nbytes.shape, after, mesh_shape)
    cut = math.prod(min(a, b) for a, b in zip(first, second))
    return mesh_shape[axis] * cut * nbytes.itemsize
