"""Colours of placements (`R`, `S(d)`, `P`) and of collective kinds, and the legend swatches.

A node's placement text is one placement per mesh axis, comma-separated (`"S(0),R"`); the
report draws one colour band per axis, so the same colour always means the same placement
whatever the axis.
"""

from __future__ import annotations

import re

from autopar.present.report.units import esc

# Replicate is neutral grey, Partial a warm red; shards of different dims get distinct cool
# and green hues so that a change of split dimension is visible at a glance.
_REPLICATE = "#d5d8dc"
_PARTIAL = "#e4572e"
_SHARDS = ("#2e86de", "#27ae60", "#8e44ad", "#16a085", "#d4a017", "#c0397b", "#5d6d7e")
_UNKNOWN = "#ffffff"
_SHARD = re.compile(r"S\((\d+)\)")

_KINDS = ("#2e86de", "#e67e22", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d")


def split_axes(placements: str) -> tuple[str, ...]:
    """`"S(0),R"` -> `("S(0)", "R")`: one placement text per mesh axis."""
    return tuple(p.strip() for p in placements.split(",")) if placements else ()


def placement_colour(placement: str) -> str:
    """The fill colour of one axis's placement text (`R`, `S(d)`, `P`, `P(op)`)."""
    if placement == "R":
        return _REPLICATE
    if placement.startswith("P"):
        return _PARTIAL
    match = _SHARD.fullmatch(placement)
    if match:
        return _SHARDS[int(match.group(1)) % len(_SHARDS)]
    return _UNKNOWN


def placement_order(placement: str) -> tuple[int, int, str]:
    """Sort key for legends: R, then S(0), S(1), ..., then P, then anything else."""
    if placement == "R":
        return (0, 0, placement)
    match = _SHARD.fullmatch(placement)
    if match:
        return (1, int(match.group(1)), placement)
    return (2 if placement.startswith("P") else 3, 0, placement)


def series_colour(index: int) -> str:
    """The colour of the `index`-th series of a stacked chart (collective kinds, axes)."""
    return _KINDS[index % len(_KINDS)]


def swatch(colour: str, label: str) -> str:
    """One legend entry: a coloured square and its label."""
    return (f'<span class="swatch"><i style="background:{colour}"></i>{esc(label)}</span>')
