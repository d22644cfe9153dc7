"""Placements: how one tensor is laid out over each mesh axis.

The vocabulary is torch.distributed.tensor's own (`Shard(dim)`, `Replicate()`,
`Partial("sum")`), reused rather than re-declared so that plans map one to one onto DTensor
layouts. A tensor's sharding over a mesh is a tuple of placements, one per mesh axis
(`Placements`). This module adds the short text form used in plans and tables:
`S(0)`, `R`, `P`, and a whole sharding as `"S(0),R"`.
"""

from __future__ import annotations

import re

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from autopar.errors import ShardingError

__all__ = [
    "Partial", "Placement", "Placements", "Replicate", "Shard", "format_placement",
    "format_placements", "parse_placement", "parse_placements", "shard_count",
    "is_split",
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
