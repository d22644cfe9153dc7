"""`WorkGraph`: the mutable working copy of a problem that the exact reductions edit.

Time is compressed into segments: maximal runs of time steps between consecutive interval
ends, over which the set of live nodes is constant, so one memory constraint per segment is
exact. A node's memory is a `Usage`: columns t of a K x T matrix, column t counting on the
segments `lo[t] <= s < hi[t]` with value `mat[k, t]` when the node picks strategy k. Nodes
start with one column; folding a leaf hands its columns to its neighbour, re-indexed by the
leaf's response.
Usage that no longer depends on any choice lives in `base` (per segment).

Every node keeps `keep[i]`, the original indices of its remaining strategies (ascending), so
the records in `log` (see `reduced_problem.py`) can map a reduced solution back to the original.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.solver.problem import ShardingProblem


@dataclass(frozen=True)
class Usage:
    """Usage terms of one node: `mat[k, t]` counts on segments `lo[t] <= s < hi[t]`."""

    lo: np.ndarray
    hi: np.ndarray
    mat: np.ndarray

    @staticmethod
    def empty(k: int) -> Usage:
        return Usage(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((k, 0)))

    @property
    def width(self) -> int:
        return self.lo.size

    def take(self, index: np.ndarray) -> Usage:
        """Re-index strategies: row r of the result is row `index[r]`."""
        return Usage(self.lo, self.hi, self.mat[index])

    def join(self, other: Usage) -> Usage:
        if not other.width:
            return self
        if not self.width:
            return other
        return Usage(np.concatenate([self.lo, other.lo]), np.concatenate([self.hi, other.hi]),
                     np.hstack([self.mat, other.mat]))

    def select(self, columns: np.ndarray) -> Usage:
        return Usage(self.lo[columns], self.hi[columns], self.mat[:, columns])

    def combined(self) -> Usage:
        """Columns with the same range summed into one."""
        if self.width < 2:
            return self
        keys, inverse = np.unique(np.stack([self.lo, self.hi]), axis=1, return_inverse=True)
        if keys.shape[1] == self.width:
            return self
        mat = np.zeros((self.mat.shape[0], keys.shape[1]))
        np.add.at(mat.T, inverse.ravel(), self.mat.T)
        return Usage(keys[0].copy(), keys[1].copy(), mat)


@dataclass(frozen=True)
class Fixed:
    """Node `node` takes original strategy `choice`."""

    node: int
    choice: int


@dataclass(frozen=True)
class Follows:
    """Node `node` takes `response[j]` where j is the position of `other`'s choice in `keys`."""

    node: int
    other: int
    keys: np.ndarray
    response: np.ndarray


@dataclass(frozen=True)
class Follows2:
    """Node `node` takes `response[ja, jb]`, positions of `a`'s and `b`'s choices in keys."""

    node: int
    a: int
    b: int
    keys_a: np.ndarray
    keys_b: np.ndarray
    response: np.ndarray


Record = Fixed | Follows | Follows2


def segment_times(problem: ShardingProblem) -> np.ndarray:
    """Sorted distinct interval ends: segment s covers times [cuts[s], cuts[s + 1])."""
    ends = [t for lo, hi in problem.intervals if lo < hi for t in (lo, hi)]
    return np.unique(np.asarray(ends, dtype=np.int64))


class WorkGraph:
    """Nodes, merged edges, usage terms and reconstruction records; edited in place."""

    def __init__(self, problem: ShardingProblem) -> None:
        n = problem.num_nodes
        self.limit = problem.usage_limit
        self.costs: list[np.ndarray] = [c.copy() for c in problem.node_costs]
        self.keep: list[np.ndarray] = [np.arange(c.size) for c in problem.node_costs]
        self.alive = np.ones(n, dtype=bool)
        self.adj: list[set[int]] = [set() for _ in range(n)]
        self.edges: dict[tuple[int, int], np.ndarray] = {}
        self.offset = 0.0
        self.log: list[Record] = []
        cuts = segment_times(problem)
        self.base = np.zeros(max(cuts.size - 1, 0))
        self.usage: list[Usage] = [Usage.empty(c.size) for c in problem.node_costs]
        if self.limit is not None:
            for i, ((lo, hi), u) in enumerate(zip(problem.intervals, problem.node_usages)):
                if lo < hi:
                    s0, s1 = np.searchsorted(cuts, (lo, hi))
                    self.usage[i] = Usage(np.array([s0]), np.array([s1]), u[:, None].copy())
        for (a, b), m in zip(problem.edges, problem.edge_costs):
            self.add_edge(a, b, m)

    # -- edges ---------------------------------------------------------------------------
    def matrix(self, a: int, b: int) -> np.ndarray:
        """Cost matrix of edge (a, b), rows indexed by a's strategies."""
        return self.edges[(a, b)] if a < b else self.edges[(b, a)].T

    def add_edge(self, a: int, b: int, m: np.ndarray) -> None:
        """Add matrix `m` (rows a) to the edge (a, b), creating it if needed. Matrices are
        never written in place (each edit makes a new one), so `m` is kept, not copied:
        copying every edge of a problem with usage nodes took a quarter of its reduction."""
        key, m = ((a, b), m) if a < b else ((b, a), m.T)
        old = self.edges.get(key)
        self.edges[key] = m if old is None else old + m
        self.adj[a].add(b)
        self.adj[b].add(a)

    def remove_edge(self, a: int, b: int) -> None:
        del self.edges[(a, b) if a < b else (b, a)]
        self.adj[a].discard(b)
        self.adj[b].discard(a)

    # -- nodes ---------------------------------------------------------------------------
    def restrict(self, i: int, mask: np.ndarray) -> None:
        """Keep only the strategies of node i where `mask` is true."""
        if mask.all():
            return
        self.costs[i] = self.costs[i][mask]
        self.keep[i] = self.keep[i][mask]
        self.usage[i] = self.usage[i].take(mask)
        for j in self.adj[i]:
            key = (i, j) if i < j else (j, i)
            m = self.edges[key]
            self.edges[key] = m[mask] if i < j else m[:, mask]

    def remove_node(self, i: int) -> None:
        for j in list(self.adj[i]):
            self.remove_edge(i, j)
        self.alive[i] = False
        self.usage[i] = Usage.empty(0)

    def add_base(self, s0: int, s1: int, value: float) -> None:
        if s0 < s1 and value:
            self.base[s0:s1] += value

    def node_usage(self, i: int) -> np.ndarray:
        """Usage features of node i: one column per term (shape K x terms)."""
        return self.usage[i].mat

    def move_usage(self, i: int, j: int, index: np.ndarray) -> None:
        """Hand node i's usage to node j, row r of j taking i's row `index[r]`."""
        self.usage[j] = self.usage[j].join(self.usage[i].take(index))

    def fix_usage(self, i: int, k: int) -> None:
        """Node i settles on strategy k: its usage becomes constant base usage."""
        u = self.usage[i]
        for lo, hi, value in zip(u.lo, u.hi, u.mat[k]):
            self.add_base(int(lo), int(hi), float(value))

    # -- memory --------------------------------------------------------------------------
    def profiles(self) -> tuple[np.ndarray, np.ndarray]:
        """Per segment: the least and the largest usage any assignment can reach."""
        diff_lo = np.zeros(self.base.size + 1)
        diff_hi = np.zeros(self.base.size + 1)
        for i in np.flatnonzero(self.alive):
            u = self.usage[i]
            if u.width:
                np.add.at(diff_lo, u.lo, u.mat.min(axis=0))
                np.add.at(diff_lo, u.hi, -u.mat.min(axis=0))
                np.add.at(diff_hi, u.lo, u.mat.max(axis=0))
                np.add.at(diff_hi, u.hi, -u.mat.max(axis=0))
        return self.base + np.cumsum(diff_lo)[:-1], self.base + np.cumsum(diff_hi)[:-1]

    def live_nodes(self) -> np.ndarray:
        return np.flatnonzero(self.alive)
