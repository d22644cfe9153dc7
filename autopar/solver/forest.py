"""Block moves on induced forests: re-choose a whole forest of nodes optimally at once.

Pick a set S of nodes whose induced subgraph has no cycle; with every other node fixed,
the best choice for all of S together is a tree dynamic programme (min-sum messages from
the leaves up, argmins back down), exact and linear in the forest's edge matrices. Repeated
with different random forests this is a strong block coordinate descent for the
(memory-priced) unconstrained problem, much stronger than changing one node at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.solver.flat import Flat


@dataclass(frozen=True)
class Forest:
    """Nodes in breadth-first order per tree, each one's parent (-1 for a root) and the
    edge matrix from the parent (rows: parent's strategies)."""

    nodes: list[int]
    parents: list[int]
    mats: list[np.ndarray | None]


def random_forest(flat: Flat, order: np.ndarray, allowed: np.ndarray | None = None) -> Forest:
    """Greedily grow an induced forest, visiting nodes in `order`.

    A node joins when its neighbours already in the forest lie in distinct trees, so no
    cycle can close. `allowed` masks nodes that may join.
    """
    # Plain lists and ints: this loop runs once per search iteration over every node, and
    # numpy's per-element indexing would take most of its time.
    neighbours = flat.neighbour_ids
    root = list(range(flat.num_nodes))
    inside = [False] * flat.num_nodes
    permitted = None if allowed is None else allowed.tolist()
    for v in order.tolist():
        if permitted is not None and not permitted[v]:
            continue
        seen: list[int] = []
        ok = True
        for j in neighbours[v]:
            if inside[j]:
                r = j
                while root[r] != r:  # find, halving the path
                    root[r] = root[root[r]]
                    r = root[r]
                if r in seen:
                    ok = False
                    break
                seen.append(r)
        if ok:
            inside[v] = True
            for r in seen:
                root[r] = v
    # Orient each tree from an arbitrary root, breadth first.
    visited = [not member for member in inside]
    nodes: list[int] = []
    parents: list[int] = []
    mats: list[np.ndarray | None] = []
    for start in range(flat.num_nodes):
        if visited[start]:
            continue
        visited[start] = True
        nodes.append(start)
        parents.append(-1)
        mats.append(None)
        head = len(nodes) - 1
        while head < len(nodes):
            u = nodes[head]
            head += 1
            for j, m in flat.nbrs[u]:
                if not visited[j]:
                    visited[j] = True
                    nodes.append(j)
                    parents.append(u)
                    mats.append(m)
    return Forest(nodes, parents, mats)


def forest_dp(flat: Flat, costs: np.ndarray, x: np.ndarray, forest: Forest,
              masks: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """Best joint choice of the forest nodes given the others fixed as in x.

    `costs` is the flat (possibly priced) node cost vector; `masks[i]` optionally forbids
    strategies of node i (False = forbidden). Returns a new assignment (a copy of x with
    the forest re-chosen); never worse than x under `costs` when x respects the masks.
    """
    inside = np.zeros(flat.num_nodes, dtype=bool)
    inside[forest.nodes] = True
    unary = flat.with_neighbours(x, costs, outside=~inside)
    acc: dict[int, np.ndarray] = {}
    for v in forest.nodes:
        a = unary[flat.offsets[v]:flat.offsets[v + 1]]
        if masks is not None and v in masks:
            a = np.where(masks[v], a, np.inf)
        acc[v] = a
    pick: dict[int, np.ndarray] = {}
    for v, p, m in zip(reversed(forest.nodes), reversed(forest.parents),
                       reversed(forest.mats)):
        if p < 0:
            continue
        table = m + acc[v]
        pick[v] = table.argmin(axis=1)
        acc[p] = acc[p] + table.min(axis=1)
    y = x.tolist()
    for v, p in zip(forest.nodes, forest.parents):
        y[v] = int(acc[v].argmin()) if p < 0 else int(pick[v][y[p]])
    return np.array(y, dtype=x.dtype)
