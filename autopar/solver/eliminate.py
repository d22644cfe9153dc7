"""Exact elimination of nodes with one strategy, no neighbour, one or two neighbours.

Each elimination writes a record (`graph.py`) that recovers the node's choice from its
neighbours'. Under a memory limit a node is only eliminated when its best response is
unique in cost and usage (`fold.py`); its usage terms then move to the neighbour that
determines them, re-indexed by the response, so memory is still counted exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from autopar.solver.fold import (
    SAMPLED_PAIRS,
    chain_response,
    leaf_response,
    pareto_mask,
    sampled_pairs,
)
from autopar.solver.graph import Fixed, Follows, Follows2, Usage, WorkGraph


def _side_usage(usage: np.ndarray, response: np.ndarray, best: np.ndarray,
                axis: int) -> np.ndarray | None:
    """Usage per choice of one neighbour when the response's usage ignores the other one.

    `usage[response]` is Ka x Kb x T; returns Ka x T (axis 1 collapsed) or Kb x T, or None
    when the usage varies along the collapsed axis among finite-cost pairs.
    """
    values = usage[response]
    finite = np.isfinite(best)[..., None]
    low = np.where(finite, values, np.inf).min(axis=axis)
    high = np.where(finite, values, -np.inf).max(axis=axis)
    empty = ~np.isfinite(low)
    if not ((low == high) | empty).all():
        return None
    return np.where(empty, 0.0, low)


class Eliminator:
    """Eliminates nodes of `g` from a work queue; calls `touch(i)` when node i and its
    neighbourhood changed, `mark(i)` when only node i did."""

    def __init__(self, g: WorkGraph, touch: Callable[[int], None],
                 mark: Callable[[int], None]) -> None:
        self.g = g
        self.touch = touch
        self.mark = mark

    def _eligible(self, i: int) -> bool:
        return bool(self.g.alive[i]) and (self.g.costs[i].size == 1 or len(self.g.adj[i]) <= 2)

    def run(self, nodes: list[int]) -> None:
        g = self.g
        queue = [i for i in nodes if self._eligible(i)]
        while queue:
            i = queue.pop()
            if not self._eligible(i):
                continue
            neighbours = list(g.adj[i])
            if g.costs[i].size == 1:
                done = self._fix(i, 0)
            elif not neighbours:
                response = leaf_response(g.costs[i][:, None], g.node_usage(i))
                done = response is not None and self._fix(i, int(response[0]))
            elif len(neighbours) == 1:
                done = self._leaf(i, neighbours[0])
            else:
                done = self._chain(i, *neighbours)
            if done:
                for j in neighbours:
                    self.touch(j)
                    if self._eligible(j):
                        queue.append(j)

    def follow(self, nodes: list[int]) -> None:
        """Merge each node whose choice is a function of a neighbour's into that neighbour.

        When every strategy of a has at most one finite-cost partner in b, b's choice is
        determined by a's: b's costs, usage terms and other edges are re-indexed by a's
        strategies and b disappears. Exact with or without memory limits. Low-degree nodes
        go first and the follower with fewer edges is the one moved, so a hub's edges are
        not copied over and over along a chain of followers.
        """
        g = self.g
        for i in sorted(nodes, key=lambda j: (len(g.adj[j]), j)):
            queue = sorted(g.adj[i]) if g.alive[i] else []
            seen = set(queue)
            while queue and g.alive[i]:
                j = queue.pop()
                if not g.alive[j] or j not in g.adj[i]:
                    continue
                m = g.matrix(i, j)
                finite = np.isfinite(m)
                j_follows = bool((finite.sum(axis=1) <= 1).all())
                i_follows = bool((finite.sum(axis=0) <= 1).all())
                if i_follows and (not j_follows or len(g.adj[i]) <= len(g.adj[j])):
                    self._merge(i, j, np.argmax(finite, axis=0), m.T)
                elif j_follows:
                    inherited = g.adj[j] - seen - {i}
                    self._merge(j, i, np.argmax(finite, axis=1), m)
                    # i took over j's edges: those are new candidates for i.
                    queue.extend(sorted(inherited))
                    seen |= inherited

    def _merge(self, b: int, a: int, f: np.ndarray, m: np.ndarray) -> None:
        g = self.g
        g.costs[a] = g.costs[a] + g.costs[b][f] + m[np.arange(f.size), f]
        g.move_usage(b, a, f)
        others = [(j, g.matrix(b, j)[f]) for j in g.adj[b] if j != a]
        g.log.append(Follows(b, a, g.keep[a].copy(), g.keep[b][f]))
        g.remove_node(b)
        for j, rows in others:
            g.add_edge(a, j, rows)
        # Only a and b's other neighbours see a change (a's other edges are as they were).
        self.mark(a)
        for j, _ in others:
            self.mark(j)

    def _fix(self, i: int, k: int) -> bool:
        g = self.g
        for j in g.adj[i]:
            g.costs[j] = g.costs[j] + g.matrix(j, i)[:, k]
        g.offset += float(g.costs[i][k])
        g.fix_usage(i, k)
        g.log.append(Fixed(i, int(g.keep[i][k])))
        g.remove_node(i)
        return True

    def _leaf(self, i: int, j: int) -> bool:
        g = self.g
        total = g.costs[i][:, None] + g.matrix(i, j)
        usage = g.node_usage(i)
        response = leaf_response(total, usage)
        if response is None:
            front = pareto_mask(total, usage)
            if front is not None and not front.any(axis=1).all():
                g.restrict(i, front.any(axis=1))
                self.touch(i)
            return False
        g.costs[j] = g.costs[j] + total[response, np.arange(total.shape[1])]
        g.move_usage(i, j, response)
        g.log.append(Follows(i, j, g.keep[j].copy(), g.keep[i][response]))
        g.remove_node(i)
        return True

    def _chain(self, i: int, a: int, b: int) -> bool:
        g = self.g
        usage = g.node_usage(i)
        left, right = g.matrix(a, i), g.matrix(i, b)
        if usage.shape[1] and left.shape[0] * right.shape[1] > SAMPLED_PAIRS:
            # The response's usage must fall to one side; where it does not on a sample of
            # the pairs (a usage of both ends: a node made of an edge usage), it does not
            # on all of them, and they need not be built.
            rows, cols = sampled_pairs(left.shape[0], right.shape[1])
            trial = chain_response(left[rows], g.costs[i], right[:, cols], usage)
            if trial is None or all(_side_usage(usage, *trial, axis) is None
                                    for axis in (1, 0)):
                return False
        result = chain_response(left, g.costs[i], right, usage)
        if result is None:
            return False
        response, best = result
        if usage.shape[1]:
            for side, axis in ((a, 1), (b, 0)):
                per_side = _side_usage(usage, response, best, axis)
                if per_side is not None:
                    u = g.usage[i]
                    g.usage[side] = g.usage[side].join(Usage(u.lo, u.hi, per_side))
                    break
            else:
                return False
        g.log.append(Follows2(i, a, b, g.keep[a].copy(), g.keep[b].copy(), g.keep[i][response]))
        g.remove_node(i)
        g.add_edge(a, b, best)
        return True
