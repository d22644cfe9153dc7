"""Placements: how one tensor is laid out over each mesh axis.

The vocabulary is torch.distributed.tensor's own (`Shard(dim)`, `Replicate()`,
`Partial("sum")`), reused rather than re-declared so that plans map one to one onto DTensor
layouts. A tensor's sharding over a mesh is a tuple of placements, one per mesh axis
(`Placements`). This module adds the short text form used in plans and tables:
`S(0)`, `R`, `P`, and a whole sharding as `"S(0),R"`, and the sizes of the pieces.

Pieces follow DTensor's chunking (`torch.chunk`): a dim of `size` cut in `n` holds chunks of
`ceil(size / n)`, the last non-empty one shorter and any after it empty (6 in 4: 2, 2, 2, 0).
A dim cut over several axes is cut outer axis first. Rank 0 (every coordinate 0) holds the
largest piece of every dim.
"""

from __future__ import annotations

import math
import re

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from autopar.errors import ShardingError

__all__ = [
    "Partial", "Placement", "Placements", "Replicate", "Shard", "format_placement",
    "format_placements", "parse_placement", "parse_placements", "shard_count",
    "is_split", "chunk_sizes", "chunk_extent", "local_shape", "is_even", "uneven_dims",
    "smallest_piece", "piece_lengths", "describe_pieces",
    "piece_bytes",
]

Placements = tuple[Placement, ...]

R = Replicate()
P = Partial("sum")

_SHARD = re.compile(r"S\((\d+)\)")


def format_placement(placement: Placement) -> str:
    """`Shard(1)` -> `"S(1)"`, `Replicate()` -> `"R"`, `Partial()` -> `"P"`."""
    if isinstance(placement, Shard):
        return f"S({placement.dim})"
    if isinstance(placement, Replicate):
        return "R"
    if isinstance(placement, Partial):
        return "P" if placement.reduce_op == "sum" else f"P({placement.reduce_op})"
    raise TypeError(f"unsupported placement {placement!r}")


def parse_placement(text: str) -> Placement:
    """Inverse of `format_placement`."""
    text = text.strip()
    if text == "R":
        return Replicate()
    if text == "P":
        return Partial("sum")
    if text.startswith("P(") and text.endswith(")"):
        return Partial(text[2:-1])
    match = _SHARD.fullmatch(text)
    if match:
        return Shard(int(match.group(1)))
    raise ShardingError(
        f"cannot read placement {text!r}",
        expected='"S(<dim>)", "R" or "P"', got=repr(text),
        fix="write one placement per mesh axis, e.g. \"S(0),R\"",
    )


def format_placements(placements: Placements) -> str:
    """One placement per mesh axis, comma separated: `"S(0),R"`."""
    return ",".join(format_placement(p) for p in placements)


def parse_placements(text: str) -> Placements:
    """Inverse of `format_placements`."""
    return tuple(parse_placement(part) for part in text.split(","))


def shard_count(placements: Placements, mesh_shape: tuple[int, ...], dim: int) -> int:
    """How many pieces tensor dimension `dim` is cut into by `placements` over the mesh."""
    count = 1
    for placement, size in zip(placements, mesh_shape, strict=True):
        if isinstance(placement, Shard) and placement.dim == dim:
            count *= size
    return count


def is_split(placement: Placement) -> bool:
    """True for placements under which each rank holds less than the full value."""
    return not isinstance(placement, Replicate)


def chunk_sizes(size: int, n: int) -> tuple[int, ...]:
    """The sizes of the `n` pieces of a dim of `size` (DTensor's chunking)."""
    return tuple(chunk_extent(size, n, i)[1] for i in range(n))


def chunk_extent(size: int, n: int, index: int) -> tuple[int, int]:
    """(offset, length) of piece `index` of a dim of `size` cut in `n` (DTensor's chunking:
    pieces of ceil(size / n), the last ones shorter or empty)."""
    full = -(-size // n)
    start = min(size, full * index)
    return start, min(size, start + full) - start


def local_shape(shape: tuple[int, ...], placements: Placements, mesh_shape: tuple[int, ...],
                coordinate: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The shape of the piece the rank at `coordinate` holds of a tensor of global `shape`
    (None: rank 0's, the largest on every dim)."""
    local = list(shape)
    for axis, placement in enumerate(placements):
        if isinstance(placement, Shard):
            index = 0 if coordinate is None else coordinate[axis]
            local[placement.dim] = chunk_extent(local[placement.dim], mesh_shape[axis], index)[1]
    return tuple(local)


def smallest_piece(size: int, placements: Placements, mesh_shape: tuple[int, ...],
                   dim: int) -> int:
    """The length of the shortest piece of `dim` (of `size`) under `placements`."""
    return min(piece_lengths(size, placements, mesh_shape, dim))


def piece_lengths(size: int, placements: Placements, mesh_shape: tuple[int, ...],
                  dim: int) -> list[int]:
    """The length of every piece of `dim` (of `size`) under `placements`, in rank order
    (outer axis first)."""
    lengths = [size]
    for axis, placement in enumerate(placements):
        if placement == Shard(dim):
            lengths = [piece for length in lengths
                       for piece in chunk_sizes(length, mesh_shape[axis])]
    return lengths


def describe_pieces(shape: tuple[int, ...], placements: Placements,
                    mesh_shape: tuple[int, ...]) -> str:
    """The pieces of each dim `placements` cut unevenly, runs of a length counted:
    `"dim 0: 12565 x3, 12562"`; empty where every cut is even."""
    parts = []
    for dim in uneven_dims(shape, placements, mesh_shape):
        runs: list[list[int]] = []
        for length in piece_lengths(shape[dim], placements, mesh_shape, dim):
            if runs and runs[-1][0] == length:
                runs[-1][1] += 1
            else:
                runs.append([length, 1])
        text = ", ".join(f"{length} x{count}" if count > 1 else str(length)
                         for length, count in runs)
        parts.append(f"dim {dim}: {text}")
    return "; ".join(parts)


def uneven_dims(shape: tuple[int, ...], placements: Placements,
                mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The dims of `shape` that `placements` cut into pieces of different sizes."""
    return tuple(d for d, size in enumerate(shape)
                 if size % shard_count(placements, mesh_shape, d))


def is_even(shape: tuple[int, ...], placements: Placements, mesh_shape: tuple[int, ...]) -> bool:
    """Whether every piece of a tensor of `shape` under `placements` has the same shape."""
    return not uneven_dims(shape, placements, mesh_shape)


def piece_bytes(shape: tuple[int, ...], itemsize: int, placements: Placements,
                mesh_shape: tuple[int, ...]) -> int:
    """Bytes of rank 0's piece, the largest one."""
    return math.prod(local_shape(shape, placements, mesh_shape)) * itemsize
