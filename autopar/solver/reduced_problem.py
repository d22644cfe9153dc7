"""`ReducedProblem`: what is left of a problem after the exact reductions, and the way back.

A reduced problem has the same shape as a `ShardingProblem` but with usage *terms* (a node
may count on several segment ranges) on compressed time, a constant `offset` cost, a
constant `base` usage per segment, and the records that expand a reduced solution into a
choice for every original node. Its cost and memory equal the original's for the expanded
assignment (the reductions are exact); `expand` is the only way back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autopar.solver.graph import Fixed, Follows, Follows2, Record


@dataclass(frozen=True, eq=False)
class ReducedProblem:
    """Nodes, edges, usage terms on segments, and the records to expand a solution."""

    costs: tuple[np.ndarray, ...]
    edges: tuple[tuple[int, int], ...]
    matrices: tuple[np.ndarray, ...]
    term_node: np.ndarray
    term_lo: np.ndarray
    term_hi: np.ndarray
    term_usage: tuple[np.ndarray, ...]
    base: np.ndarray
    limit: float | None
    offset: float
    original: tuple[int, ...]
    keep: tuple[np.ndarray, ...]
    log: tuple[Record, ...]
    num_original: int

    def __post_init__(self) -> None:
        for (a, b), m in zip(self.edges, self.matrices):
            assert a < b and m.shape == (self.costs[a].size, self.costs[b].size)
        for i, vec in zip(self.term_node, self.term_usage):
            assert vec.shape == self.costs[i].shape

    @property
    def num_nodes(self) -> int:
        return len(self.costs)

    @property
    def num_segments(self) -> int:
        return self.base.size

    @property
    def sizes(self) -> np.ndarray:
        return np.array([c.size for c in self.costs], dtype=np.int64)

    def cost(self, choices: Sequence[int]) -> float:
        """Objective of a reduced assignment, including the constant offset."""
        total = self.offset + sum(float(c[k]) for c, k in zip(self.costs, choices))
        return total + sum(float(m[choices[a], choices[b]])
                           for (a, b), m in zip(self.edges, self.matrices))

    def profile(self, choices: Sequence[int]) -> np.ndarray:
        """Usage per segment of a reduced assignment (base included)."""
        diff = np.zeros(self.base.size + 1)
        values = np.array([vec[choices[i]] for i, vec in zip(self.term_node, self.term_usage)])
        if values.size:
            np.add.at(diff, self.term_lo, values)
            np.add.at(diff, self.term_hi, -values)
        return self.base + np.cumsum(diff)[:-1]

    def fits(self, choices: Sequence[int]) -> bool:
        """Whether the assignment's usage stays within the limit on every segment."""
        if self.limit is None or self.base.size == 0:
            return True
        return bool((self.profile(choices) <= self.limit).all())

    def restrict(self, choices: Sequence[int]) -> np.ndarray | None:
        """The reduced assignment that keeps the original `choices` of the nodes left, or
        None when one of them lost its strategy in the reductions (or `choices` does not
        have one per original node). Its expansion keeps those choices; the nodes the
        reductions removed take their best responses, which cost and use no more (the
        reductions are exact)."""
        if len(choices) != self.num_original:
            return None
        picked = np.empty(self.num_nodes, dtype=np.int64)
        for i, (node, kept) in enumerate(zip(self.original, self.keep)):
            at = int(np.searchsorted(kept, choices[node]))
            if at == kept.size or kept[at] != choices[node]:
                return None
            picked[i] = at
        return picked

    def expand(self, choices: Sequence[int]) -> tuple[int, ...]:
        """Original strategy index of every original node for a reduced assignment."""
        full = np.full(self.num_original, -1, dtype=np.int64)
        for i, k in enumerate(choices):
            full[self.original[i]] = self.keep[i][int(k)]
        for record in reversed(self.log):
            if isinstance(record, Fixed):
                full[record.node] = record.choice
            elif isinstance(record, Follows):
                j = np.searchsorted(record.keys, full[record.other])
                full[record.node] = record.response[j]
            else:
                assert isinstance(record, Follows2)
                ja = np.searchsorted(record.keys_a, full[record.a])
                jb = np.searchsorted(record.keys_b, full[record.b])
                full[record.node] = record.response[ja, jb]
        assert (full >= 0).all()
        return tuple(int(k) for k in full)
