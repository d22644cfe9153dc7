"""`CommCounter`: the bytes the runtime's collectives move, measured the cost model's way.

Keys are (kind, axis name, direction) with kind one of `autopar.costs.formulas.COLLECTIVES` and
direction "forward" or "backward". Bytes follow `autopar.costs.formulas.Transfer.nbytes`: the
per-rank buffer B, i.e. the tensor on the rank for all-reduce and all-to-all, the gathered output
for all-gather, the input for reduce-scatter. Measured totals of an edge therefore equal
`transfer_totals(cost.edge_transfers(...))` exactly.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from autopar.costs.formulas import COLLECTIVES, Transfer

DIRECTIONS = ("forward", "backward")

Key = tuple[str, str, str]


class CommCounter:
    """Bytes and calls per (kind, axis name, direction); a plain object the caller owns."""

    def __init__(self) -> None:
        self._bytes: dict[Key, int] = {}
        self._calls: dict[Key, int] = {}

    def record(self, kind: str, axis: str, direction: str, nbytes: int) -> None:
        """Count one collective of `nbytes` (per-rank buffer B) over mesh axis `axis`."""
        assert kind in COLLECTIVES and direction in DIRECTIONS, (kind, direction)
        key = (kind, axis, direction)
        self._bytes[key] = self._bytes.get(key, 0) + int(nbytes)
        self._calls[key] = self._calls.get(key, 0) + 1

    def totals(self) -> dict[Key, int]:
        """Bytes per key, for the keys that saw at least one collective."""
        return dict(self._bytes)

    def calls(self) -> dict[Key, int]:
        """Number of collectives per key."""
        return dict(self._calls)

    def nbytes(self, kind: str | None = None, axis: str | None = None,
               direction: str | None = None) -> int:
        """Total bytes over the keys matching every given field."""
        return sum(b for (k, a, d), b in self._bytes.items()
                   if kind in (None, k) and axis in (None, a) and direction in (None, d))

    def reset(self) -> None:
        self._bytes.clear()
        self._calls.clear()

    def __repr__(self) -> str:
        return f"CommCounter({self._bytes!r})"


def transfer_totals(transfers: Iterable[Transfer], axis_names: tuple[str, ...]) -> dict[Key, int]:
    """The cost model's transfers summed per key, comparable with `CommCounter.totals()`.

    Transfers must have concrete sizes (numbers, not sympy formulas with free symbols).
    """
    totals: dict[Key, int] = {}
    for transfer in transfers:
        key = (transfer.kind, axis_names[transfer.axis],
               "backward" if transfer.backward else "forward")
        nbytes = transfer.nbytes
        assert int(nbytes) == nbytes, f"fractional bytes {nbytes} in {transfer}"
        totals[key] = totals.get(key, 0) + int(nbytes)
    return totals


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements, as a collective moves them."""
    return t.numel() * t.element_size()
