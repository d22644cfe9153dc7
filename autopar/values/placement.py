"""Placements: how one tensor is laid out over each mesh axis.

The vocabulary is torch.distributed.tensor's own (`Shard(dim)`, `Replicate()`,
`Partial("sum")`), reused rather than re-declared so that plans map one to one onto DTensor
layouts. A tensor's sharding over a mesh is a tuple of placements, one per mesh axis
(`Placements`). This module adds the short text form used in plans and tables:
`S(0)`, `R`, `P`, and a whole sharding as `"S(0),R"`, and the sizes of the pieces.

Pieces follow DTensor's chunking (`torch.chunk`): a dim of `size` cut in `n` holds chunks of
`ceil(size / n)`, the last non-empty one shorter and any after it empty (6 in 4: 2, 2, 2, 0).
An axis may instead have shares, one weight per index (`Shares`: the mesh's, sized to its
devices' speed): its pieces are then proportional to them, the rounding left over going to
the largest remainders, first index first on ties (6 in shares 1, 1, 1, 1: 2, 2, 1, 1; 8 in
3, 1: 6, 2). A dim cut over several axes is cut outer axis first. Rank 0 (every coordinate
0) holds the largest piece of every dim under DTensor's chunking.
"""

from __future__ import annotations

import re

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from autopar.errors import ShardingError

__all__ = [
    "Partial", "Placement", "Placements", "Replicate", "Shard", "format_placement",
    "format_placements", "parse_placement", "parse_placements", "shard_count",
    "is_split", "chunk_sizes", "chunk_extent", "local_shape", "uneven_dims",
    "smallest_piece", "piece_lengths", "describe_pieces", "Shares",
]

Placements = tuple[Placement, ...]
# Per mesh axis, the weights of its indices' pieces, or None for DTensor's chunking; None
# for a mesh whose every axis chunks as DTensor does.
Shares = tuple[tuple[int, ...] | None, ...] | None

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


def chunk_sizes(size: int, n: int, weights: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The lengths of the `n` pieces of a dim of `size`: DTensor's chunking, or in
    proportion to `weights` (module docstring)."""
    if weights is None:
        full = -(-size // n)
        return tuple(max(0, min(size - full * i, full)) for i in range(n))
    total = sum(weights)
    lengths = [size * w // total for w in weights]
    # Largest remainders first, the first index first among equal ones.
    order = sorted(range(n), key=lambda i: (-(size * weights[i] % total), i))
    for i in order[:size - sum(lengths)]:
        lengths[i] += 1
    return tuple(lengths)


def chunk_extent(size: int, n: int, index: int,
                 weights: tuple[int, ...] | None = None) -> tuple[int, int]:
    """(offset, length) of piece `index` of a dim of `size` cut in `n` (`chunk_sizes`)."""
    lengths = chunk_sizes(size, n, weights)
    return sum(lengths[:index]), lengths[index]


def _weights(shares: Shares, axis: int) -> tuple[int, ...] | None:
    return None if shares is None else shares[axis]


def local_shape(shape: tuple[int, ...], placements: Placements, mesh_shape: tuple[int, ...],
                coordinate: tuple[int, ...] | None = None, shares: Shares = None
                ) -> tuple[int, ...]:
    """The shape of the piece the rank at `coordinate` holds of a tensor of global `shape`
    (None, for the coordinate or one axis's index: the largest pieces, rank 0's under
    DTensor's chunking)."""
    local = list(shape)
    for axis, placement in enumerate(placements):
        if isinstance(placement, Shard):
            lengths = chunk_sizes(local[placement.dim], mesh_shape[axis], _weights(shares, axis))
            index = None if coordinate is None else coordinate[axis]
            local[placement.dim] = max(lengths) if index is None else lengths[index]
    return tuple(local)


def cut_by_shares(placements: Placements, shares: Shares) -> bool:
    """Whether `placements` split a tensor over an axis that cuts by its shares."""
    return shares is not None and any(
        weights is not None and isinstance(p, Shard) for weights, p in zip(shares, placements))


def piece_offsets(shape: tuple[int, ...], placements: Placements,
                  mesh_shape: tuple[int, ...], coordinate: tuple[int, ...],
                  shares: Shares = None) -> tuple[int, ...]:
    """Where, in a tensor of global `shape`, the piece the rank at `coordinate` holds
    starts: per dim, the offsets of its pieces along the axes cutting it, outer first
    (DTensor's order), each within what the axes before it left."""
    offsets, lengths = [0] * len(shape), list(shape)
    for axis, placement in enumerate(placements):
        if isinstance(placement, Shard):
            offset, lengths[placement.dim] = chunk_extent(
                lengths[placement.dim], mesh_shape[axis], coordinate[axis], _weights(shares, axis))
            offsets[placement.dim] += offset
    return tuple(offsets)


def smallest_piece(size: int, placements: Placements, mesh_shape: tuple[int, ...],
                   dim: int, shares: Shares = None) -> int:
    """The length of the shortest piece of `dim` (of `size`) under `placements`."""
    return min(piece_lengths(size, placements, mesh_shape, dim, shares))


def piece_lengths(size: int, placements: Placements, mesh_shape: tuple[int, ...],
                  dim: int, shares: Shares = None) -> list[int]:
    """The length of every piece of `dim` (of `size`) under `placements`, in rank order
    (outer axis first)."""
    lengths = [size]
    for axis, placement in enumerate(placements):
        if placement == Shard(dim):
            lengths = [piece for length in lengths for piece in
                       chunk_sizes(length, mesh_shape[axis], _weights(shares, axis))]
    return lengths


def describe_pieces(shape: tuple[int, ...], placements: Placements,
                    mesh_shape: tuple[int, ...], shares: Shares = None) -> str:
    """The pieces of each dim `placements` cut unevenly, runs of a length counted:
    `"dim 0: 12565 x3, 12562"`; empty where every cut is even."""
    parts = []
    for dim in uneven_dims(shape, placements, mesh_shape, shares):
        runs: list[list[int]] = []
        for length in piece_lengths(shape[dim], placements, mesh_shape, dim, shares):
            if runs and runs[-1][0] == length:
                runs[-1][1] += 1
            else:
                runs.append([length, 1])
        text = ", ".join(f"{length} x{count}" if count > 1 else str(length)
                         for length, count in runs)
        parts.append(f"dim {dim}: {text}")
    return "; ".join(parts)


def uneven_dims(shape: tuple[int, ...], placements: Placements,
                mesh_shape: tuple[int, ...], shares: Shares = None) -> tuple[int, ...]:
    """The dims of `shape` that `placements` cut into pieces of different sizes."""
    return tuple(d for d, size in enumerate(shape)
                 if len(set(piece_lengths(size, placements, mesh_shape, d, shares))) > 1)
