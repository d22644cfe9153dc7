"""Sequential tree-reweighted message passing (TRW-S) for the unconstrained problem.

Kolmogorov's TRW-S: sweep the nodes in a fixed order and back, updating min-sum messages
along edges with the tree-reweighting factor 1/max(#earlier, #later neighbours). Each
sweep also decodes an assignment greedily (each node's best choice given the earlier nodes'
choices and the later nodes' messages). Messages persist between calls, so when the node
costs change a little (new memory prices) the next sweep starts from a good state.
Infinite costs are replaced by a large finite penalty so messages stay well defined.
"""

from __future__ import annotations

import numpy as np

from autopar.solver.flat import Flat


class Trws:
    """Message state of TRW-S over the graph of `flat`, in node order 0 .. n-1."""

    def __init__(self, flat: Flat, big: float) -> None:
        self.flat = flat
        self.big = big
        n = flat.num_nodes
        # Directed message (j -> i) lives at slot ids[i][t] for the t-th neighbour j of i.
        self.links: list[list[tuple[int, np.ndarray, int, int]]] = [[] for _ in range(n)]
        slot: dict[tuple[int, int], int] = {}
        for i in range(n):
            for j, _ in flat.nbrs[i]:
                slot[(j, i)] = len(slot)
        self.msg: list[np.ndarray] = [np.zeros(0)] * len(slot)
        for i in range(n):
            for j, m in flat.nbrs[i]:
                mm = np.minimum(m, big)
                self.links[i].append((j, mm, slot[(j, i)], slot[(i, j)]))
                self.msg[slot[(j, i)]] = np.zeros(flat.sizes[i])
        self.gamma = np.array([1.0 / max(sum(j < i for j, *_ in self.links[i]),
                                         sum(j > i for j, *_ in self.links[i]), 1)
                               for i in range(n)])

    def sweep(self, costs: np.ndarray, forward: bool) -> np.ndarray:
        """One pass in node order (or reverse); returns the greedily decoded assignment."""
        flat = self.flat
        n = flat.num_nodes
        unary = np.minimum(costs, self.big)
        x = np.zeros(n, dtype=np.int64)
        done = np.zeros(n, dtype=bool)
        msg = self.msg
        for i in (range(n) if forward else range(n - 1, -1, -1)):
            theta = unary[flat.offsets[i]:flat.offsets[i + 1]]
            hat = theta.copy()
            label = theta.copy()
            for j, m, inc, _ in self.links[i]:
                hat += msg[inc]
                label += m[:, x[j]] if done[j] else msg[inc]
            x[i] = int(np.argmin(label))
            done[i] = True
            scaled = self.gamma[i] * hat
            for j, m, inc, out in self.links[i]:
                if (j > i) == forward:
                    new = (scaled - msg[inc])[:, None] + m
                    out_msg = new.min(axis=0)
                    msg[out] = out_msg - out_msg.min()
        return x
