"""Exact reductions: shrink a `ShardingProblem` without changing its optimum.

Applied to a fixpoint: tie groups become one node; forbidden strategies and strategies
without any finite partner on an edge go; edges that split into per-node costs go; usage
terms on segments that can never exceed the limit go, and choice-independent ones become
constant base usage; dominated strategies (no better in cost, any usage term or any edge
row than another) go; nodes with one strategy, leaves and degree-2 nodes are folded into
their neighbours when their best response is unique in cost *and* memory (`fold.py`).
Every step keeps at least one optimal solution, so the reduced optimum is the original's.
Raises `Infeasible` when a node loses all strategies or the least possible usage of some
segment exceeds the limit: the problem then has no feasible assignment at all.
"""

from __future__ import annotations

import numpy as np

from autopar.solver.eliminate import Eliminator
from autopar.solver.graph import Follows, WorkGraph
from autopar.solver.problem import ShardingProblem
from autopar.solver.reduced_problem import ReducedProblem

# Largest K x K x features comparison done for the dominance test of one node.
MAX_DOMINANCE = 20_000_000


class Infeasible(Exception):
    """The problem provably has no feasible assignment."""


def _merge_ties(g: WorkGraph, ties: tuple[tuple[int, ...], ...]) -> None:
    parent = list(range(len(g.costs)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for group in ties:
        for j in group[1:]:
            a, b = sorted((find(group[0]), find(j)))
            parent[b] = a
    for j in range(len(parent)):
        r = find(j)
        if r == j:
            continue
        g.costs[r] = g.costs[r] + g.costs[j]
        g.usage[r] = g.usage[r].join(g.usage[j])
        for m in list(g.adj[j]):
            matrix = g.matrix(j, m)
            g.remove_edge(j, m)
            if m == r:
                g.costs[r] = g.costs[r] + np.diag(matrix)
            else:
                g.add_edge(r, m, matrix)
        g.log.append(Follows(j, r, g.keep[r].copy(), g.keep[r].copy()))
        g.remove_node(j)


class Reducer:
    """Runs the reduction passes over dirty nodes until nothing changes."""

    def __init__(self, g: WorkGraph) -> None:
        self.g = g
        self.dirty: set[int] = set(int(i) for i in g.live_nodes())
        limit = g.limit
        self.tol = 0.0 if limit is None or float(limit).is_integer() else 1e-9 * abs(limit)
        self.elim = Eliminator(g, self.touch, self.dirty_add)

    def dirty_add(self, i: int) -> None:
        self.dirty.add(i)

    def touch(self, i: int) -> None:
        """Mark node i and its neighbours for another look."""
        self.dirty.add(i)
        self.dirty.update(self.g.adj[i])

    def run(self) -> None:
        while self.dirty:
            nodes = sorted(i for i in self.dirty if self.g.alive[i])
            self.dirty = set()
            # Cheap structural steps first: merging followers and folding leaves shrink
            # the graph before the per-node comparisons run.
            self.forbidden(nodes)
            self.separable(nodes)
            self.elim.follow([i for i in nodes if self.g.alive[i]])
            self.elim.run([i for i in nodes if self.g.alive[i]])
            self.memory()
            self.dominance([i for i in nodes if self.g.alive[i]])

    def forbidden(self, nodes: list[int]) -> None:
        g, pending = self.g, set(nodes)
        # Rounds over a set, so a hub is re-checked once per round, not once per neighbour.
        while pending:
            changed: set[int] = set()
            for i in sorted(pending):
                if not g.alive[i]:
                    continue
                mask = np.isfinite(g.costs[i])
                for j in g.adj[i]:
                    mask &= np.isfinite(g.matrix(i, j)).any(axis=1)
                if not mask.any():
                    raise Infeasible(f"node {i} has no strategy with a finite cost")
                if not mask.all():
                    g.restrict(i, mask)
                    self.touch(i)
                    changed.update(g.adj[i])
            pending = changed

    def separable(self, nodes: list[int]) -> None:
        """Drop edges whose matrix is row term + column term: they are node costs."""
        g = self.g
        for i in nodes:
            for j in [j for j in g.adj[i] if g.alive[i]]:
                m = g.matrix(i, j)
                if not np.isfinite(m).all():
                    continue
                row, col = m[:, 0], m[0, :] - m[0, 0]
                if np.array_equal(row[:, None] + col[None, :], m):
                    g.costs[i] = g.costs[i] + row
                    g.costs[j] = g.costs[j] + col
                    g.remove_edge(i, j)
                    self.touch(i)
                    self.touch(j)

    def memory(self) -> None:
        g = self.g
        if g.limit is None:
            return
        if g.base.size == 0:
            # No interval at all: the peak is 0 (as `ShardingProblem.peak_usage` says).
            if g.limit < -self.tol:
                raise Infeasible("the usage limit is below zero")
            return
        least, most = g.profiles()
        if (least > g.limit + self.tol).any():
            raise Infeasible("the least possible usage exceeds the limit")
        tight = np.concatenate([[0], np.cumsum(most > g.limit - self.tol)])
        for i in g.live_nodes():
            u = g.usage[i]
            if not u.width:
                continue
            binding = tight[u.hi] > tight[u.lo]
            constant = u.mat.min(axis=0) == u.mat.max(axis=0)
            for lo, hi, value in zip(u.lo[binding & constant], u.hi[binding & constant],
                                     u.mat[0, binding & constant]):
                g.add_base(int(lo), int(hi), float(value))
            kept = binding & ~constant
            if not kept.all():
                self.touch(int(i))
            g.usage[i] = u.select(kept).combined()

    def dominance(self, nodes: list[int]) -> None:
        g = self.g
        for i in nodes:
            k = g.costs[i].size
            if k < 2:
                continue
            parts = [g.costs[i][:, None], g.node_usage(i)]
            parts += [g.matrix(i, j) for j in g.adj[i]]
            features = np.hstack(parts)
            if k * k * features.shape[1] > MAX_DOMINANCE:
                continue
            mask = ~_beaten(features)
            if not mask.all():
                g.restrict(i, mask)
                self.touch(i)


# `_beaten` compares every pair of strategies on this many leading columns at once, then
# only the pairs still undecided, this many columns at a time.
DOMINANCE_HEAD, DOMINANCE_BLOCK = 4, 32


def _beaten(features: np.ndarray) -> np.ndarray:
    """Rows of `features` (strategies x features) beaten by another: no better in every
    column, and worse in one or equal with a lower index (ties keep the first).

    Most pairs are decided by the first few columns (cost, memory), so the pairs left
    after them are filtered a block at a time instead of comparing all K x K x F cells
    (on a 126-layer Llama's problems, 30% less time)."""
    k = features.shape[0]
    head = features[:, :DOMINANCE_HEAD]
    undecided = (head[:, None, :] <= head[None, :, :]).all(axis=2)
    np.fill_diagonal(undecided, False)
    a, b = np.nonzero(undecided)
    for start in range(DOMINANCE_HEAD, features.shape[1], DOMINANCE_BLOCK):
        if a.size == 0:
            break
        block = features[:, start:start + DOMINANCE_BLOCK]
        kept = (block[a] <= block[b]).all(axis=1)
        a, b = a[kept], b[kept]
    equal = (features[a] == features[b]).all(axis=1)
    beaten = np.zeros(k, dtype=bool)
    beaten[b[~equal | (a < b)]] = True
    return beaten


def reduce_problem(problem: ShardingProblem) -> ReducedProblem:
    """Apply all exact reductions; raise `Infeasible` when none can fit."""
    g = WorkGraph(problem)
    _merge_ties(g, problem.ties)
    reducer = Reducer(g)
    reducer.run()
    return _freeze(g, reducer.tol)


def _freeze(g: WorkGraph, tol: float) -> ReducedProblem:
    nodes = g.live_nodes()
    index = {int(i): r for r, i in enumerate(nodes)}
    edges, matrices = [], []
    for (a, b), m in sorted(g.edges.items()):
        edges.append((index[a], index[b]))
        matrices.append(m)
    terms = [(index[int(i)], int(lo), int(hi), g.usage[i].mat[:, t]) for i in nodes
             for t, (lo, hi) in enumerate(zip(g.usage[i].lo, g.usage[i].hi))]
    # Keep only segments that can bind, merging runs whose set of live terms is the same.
    _, most = g.profiles() if g.base.size else (None, np.zeros(0))
    cuts = np.unique([s for _, s0, s1, _ in terms for s in (s0, s1)]).astype(np.int64)
    limit = g.limit if g.limit is not None else np.inf
    starts, base = [], []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        binding = most[lo:hi] > limit - tol
        if binding.any():
            starts.append(lo)
            base.append(g.base[lo:hi][binding].max())
    starts_arr = np.asarray(starts, dtype=np.int64)
    lo_new = np.searchsorted(starts_arr, [t[1] for t in terms]).astype(np.int64)
    hi_new = np.searchsorted(starts_arr, [t[2] for t in terms]).astype(np.int64)
    base_arr = np.asarray(base, dtype=np.float64)
    if all((t[3] >= 0).all() for t in terms):
        keep = _undominated(lo_new, hi_new, base_arr)
        rank = np.concatenate([[0], np.cumsum(keep)])
        lo_new, hi_new, base_arr = rank[lo_new], rank[hi_new], base_arr[keep]
    live = lo_new < hi_new
    kept_terms = [t for t, ok in zip(terms, live) if ok]
    return ReducedProblem(
        costs=tuple(g.costs[i] for i in nodes), edges=tuple(edges), matrices=tuple(matrices),
        term_node=np.array([t[0] for t in kept_terms], dtype=np.int64),
        term_lo=lo_new[live], term_hi=hi_new[live],
        term_usage=tuple(t[3] for t in kept_terms),
        base=base_arr, limit=g.limit, offset=g.offset,
        original=tuple(int(i) for i in nodes), keep=tuple(g.keep[i] for i in nodes),
        log=tuple(g.log), num_original=len(g.costs))


def _undominated(lo: np.ndarray, hi: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Segments whose memory constraint is not implied by a neighbouring segment's.

    With non-negative usages, segment q's constraint follows from q+1's when every term
    live at q is still live at q+1 (none ends at q+1) and q's base is no larger; likewise
    from q-1's when none starts at q and q's base is strictly smaller. The two rules never
    drop both members of a pair, so every dropped constraint stays implied by a kept one.
    """
    n = base.size
    keep = np.ones(n, dtype=bool)
    if n < 2:
        return keep
    live = lo < hi
    ends = np.bincount(hi[live], minlength=n + 1)
    begins = np.bincount(lo[live], minlength=n + 1)
    forward = (ends[1:n] == 0) & (base[:-1] <= base[1:])
    backward = (begins[1:n] == 0) & (base[1:] < base[:-1])
    keep[:-1] &= ~forward
    keep[1:] &= ~backward
    return keep
