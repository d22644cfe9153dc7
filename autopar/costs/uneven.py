"""The bytes of a tensor that some split cuts unevenly.

A split follows DTensor's chunking (`autopar.values.placement`): a dim of s cut in n holds
pieces of ceil(s / n), the last ones shorter; or, on an axis with shares, pieces in
proportion to them. The runtime sends uneven pieces padded to the largest
(`autopar.runtime.axis_ops`), so a rank's figures are those of the largest pieces (rank 0's
under DTensor's chunking):

    piece      = itemsize x prod_d  local_d                   (the largest piece)
    collective = n x itemsize x prod_d  min(before_d, after_d)  (gather, scatter, all-to-all)
    all_reduce = piece before the step

with local_d, before_d, after_d the sizes of the largest piece of dim d (before and after
the step). Where every dim divides, these are the even formulas: nbytes / pieces, times n for
the larger side of a gather.

The cost model passes sizes around as numbers. `TensorBytes` is the number (the whole
tensor's bytes, an int) that also carries the shape and the mesh's shares, so that
`piece_bytes` and `buffer_bytes` can take the largest piece; `tensor_bytes` makes one only
for a tensor some split of the mesh cuts unevenly, and plain numbers keep the even
formulas.
"""

from __future__ import annotations

import functools
import itertools
import math

from autopar.values.mesh import Mesh
from autopar.values.placement import Placements, Shard, Shares, local_shape
from autopar.values.specs import TensorSpec


class TensorBytes(int):
    """The bytes of a tensor of `shape` and `itemsize` (the int), whose pieces may differ."""

    shape: tuple[int, ...]
    itemsize: int
    shares: Shares

    def __new__(cls, shape: tuple[int, ...], itemsize: int, shares: Shares = None
                ) -> TensorBytes:
        value = super().__new__(cls, math.prod(shape) * itemsize)
        value.shape, value.itemsize, value.shares = tuple(shape), itemsize, shares
        return value

    # Two tensors of equal bytes but different shapes have different pieces: caches keyed
    # by sizes must tell them apart.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, TensorBytes):
            return (int(self), self.shape, self.shares) == (int(other), other.shape,
                                                           other.shares)
        return int(self) == other

    def __ne__(self, other: object) -> bool:  # int's own would compare the bytes alone
        return not self == other

    def __hash__(self) -> int:
        return hash((int(self), self.shape, self.shares))

    def __reduce__(self):
        return TensorBytes, (self.shape, self.itemsize, self.shares)

    def __repr__(self) -> str:
        return f"TensorBytes({int(self)}, shape={self.shape})"


def tensor_bytes(spec: TensorSpec, mesh_shape: tuple[int, ...], shares: Shares = None, *,
                 symbolic: bool = False):
    """The size the cost model takes for the tensor `spec` on a mesh of `mesh_shape` and
    `shares`: a `TensorBytes` where some set of the mesh's axes may cut one of its dims
    unevenly (and no dim is empty), else its bytes (with `symbolic`, a sympy expression
    where its shape is symbolic: a dynamic dim is never split unevenly)."""
    weighted = shares is not None and any(w is not None for w in shares)
    if spec.sym_shape is None and (weighted or _uneven(tuple(spec.shape), tuple(mesh_shape))):
        return TensorBytes(spec.shape, spec.itemsize, shares if weighted else None)
    return spec.sym_nbytes if symbolic else spec.nbytes


def cost_bytes(spec: TensorSpec, mesh: Mesh, *, symbolic: bool = False):
    """`tensor_bytes` of `spec` on `mesh` (its shape and shares)."""
    return tensor_bytes(spec, mesh.shape, mesh.shares, symbolic=symbolic)


@functools.lru_cache(maxsize=1 << 14)
def _uneven(shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> bool:
    counts = {math.prod(axes) for k in range(1, len(mesh_shape) + 1)
              for axes in itertools.combinations(mesh_shape, k)}
    return all(shape) and any(size % n for size in shape for n in counts if 1 < n <= size)


def piece_bytes(nbytes: TensorBytes, placements: Placements, mesh_shape: tuple[int, ...]) -> int:
    """Bytes of the largest piece of the tensor under `placements`."""
    return math.prod(local_shape(nbytes.shape, placements, mesh_shape,
                                 shares=nbytes.shares)) * nbytes.itemsize


def imbalance(nbytes, placements: Placements, mesh_shape: tuple[int, ...],
              coordinate: tuple[int | None, ...] | None = None) -> float:
    """How much more than an even share of the tensor the rank at `coordinate` holds under
    `placements` (None, or None for an axis: the largest pieces): its piece over
    nbytes / pieces (1 for a plain size)."""
    if not isinstance(nbytes, TensorBytes):
        return 1.0
    pieces = math.prod(n for p, n in zip(placements, mesh_shape) if isinstance(p, Shard))
    piece = math.prod(local_shape(nbytes.shape, placements, mesh_shape, coordinate,
                                  nbytes.shares)) * nbytes.itemsize
    return piece * pieces / int(nbytes)


def buffer_bytes(nbytes: TensorBytes, kind: str, axis: int, before: Placements,
                 after: Placements, mesh_shape: tuple[int, ...]) -> int:
    """The buffer B of one collective over `axis` turning `before` into `after` (module
    docstring): the larger side, uneven pieces padded to the largest."""
    first = local_shape(nbytes.shape, before, mesh_shape, shares=nbytes.shares)
    if kind == "all_reduce":
        return math.prod(first) * nbytes.itemsize
    second = local_shape(nbytes.shape, after, mesh_shape, shares=nbytes.shares)
    cut = math.prod(min(a, b) for a, b in zip(first, second))
    return mesh_shape[axis] * cut * nbytes.itemsize
