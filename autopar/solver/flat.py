"""`Flat`: a reduced problem laid out in flat numpy arrays for fast evaluation.

Strategies of all nodes are concatenated (node i owns `offsets[i] .. offsets[i+1]`), edge
matrices are concatenated row-major, usage terms' vectors too. With that layout the cost,
the usage profile and the memory-priced node costs of an assignment are a few vectorised
numpy calls, which the heuristics evaluate thousands of times.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from autopar.solver.reduced_problem import ReducedProblem


@dataclass(frozen=True, eq=False)
class Flat:
    """Flat arrays of a `ReducedProblem`; `nbrs[i]` lists (j, matrix rows i) per edge."""

    problem: ReducedProblem
    sizes: np.ndarray
    offsets: np.ndarray
    cost_flat: np.ndarray
    edge_a: np.ndarray
    edge_b: np.ndarray
    edge_off: np.ndarray
    edge_cols: np.ndarray
    edge_flat: np.ndarray
    nbrs: tuple[tuple[tuple[int, np.ndarray], ...], ...]
    term_node: np.ndarray
    term_lo: np.ndarray
    term_hi: np.ndarray
    term_off: np.ndarray
    term_flat: np.ndarray
    term_pos: np.ndarray
    integral: bool
    # Edge costs as paid by single strategies (`with_neighbours`): per (edge, strategy of
    # one end) the strategy's flat cell, the edge entry for the other end's strategy 0,
    # the other end, and the entry's stride per strategy of the other end.
    pay_cell: np.ndarray
    pay_base: np.ndarray
    pay_other: np.ndarray
    pay_stride: np.ndarray

    @staticmethod
    def build(problem: ReducedProblem) -> Flat:
        sizes = problem.sizes
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        cost_flat = np.concatenate(problem.costs) if sizes.size else np.zeros(0)
        mats = problem.matrices
        edge_a = np.array([a for a, _ in problem.edges], dtype=np.int64)
        edge_b = np.array([b for _, b in problem.edges], dtype=np.int64)
        lengths = np.array([m.size for m in mats], dtype=np.int64)
        edge_off = np.concatenate([[0], np.cumsum(lengths)])[:-1].astype(np.int64)
        edge_cols = np.array([m.shape[1] for m in mats], dtype=np.int64)
        edge_flat = np.concatenate([m.ravel() for m in mats]) if mats else np.zeros(0)
        nbrs: list[list[tuple[int, np.ndarray]]] = [[] for _ in sizes]
        for (a, b), m in zip(problem.edges, mats):
            nbrs[a].append((b, m))
            nbrs[b].append((a, m.T))
        term_sizes = sizes[problem.term_node] if problem.term_node.size else np.zeros(0, int)
        term_off = np.concatenate([[0], np.cumsum(term_sizes)])[:-1].astype(np.int64)
        term_flat = (np.concatenate(problem.term_usage) if problem.term_usage
                     else np.zeros(0))
        # Flat strategy position of every entry of every term vector.
        term_pos = (np.repeat(offsets[problem.term_node], term_sizes) + _ranges(term_sizes)
                    if problem.term_node.size else np.zeros(0, dtype=np.int64))
        limit = problem.limit
        integral = bool(np.array_equal(term_flat, np.round(term_flat))
                        and np.array_equal(problem.base, np.round(problem.base))
                        and (limit is None or float(limit).is_integer()))
        # Strategy k of a pays M[k, x_b] at edge_off + k * cols + x_b; strategy l of b
        # pays M[x_a, l] at edge_off + x_a * cols + l.
        edges = np.arange(edge_a.size)
        side_a, side_b = np.repeat(edges, sizes[edge_a]), np.repeat(edges, sizes[edge_b])
        k, l_ = _ranges(sizes[edge_a]), _ranges(sizes[edge_b])
        pay_cell = np.concatenate([offsets[edge_a][side_a] + k, offsets[edge_b][side_b] + l_])
        pay_base = np.concatenate([edge_off[side_a] + k * edge_cols[side_a],
                                   edge_off[side_b] + l_])
        pay_other = np.concatenate([edge_b[side_a], edge_a[side_b]])
        pay_stride = np.concatenate([np.ones(k.size, dtype=np.int64), edge_cols[side_b]])
        return Flat(problem, sizes, offsets, cost_flat, edge_a, edge_b, edge_off, edge_cols,
                    edge_flat, tuple(tuple(n) for n in nbrs), problem.term_node,
                    problem.term_lo, problem.term_hi, term_off, term_flat, term_pos, integral,
                    pay_cell, pay_base, pay_other, pay_stride)

    @property
    def num_nodes(self) -> int:
        return self.sizes.size

    @property
    def limit(self) -> float:
        """The usage limit; for fractional limits slightly lowered, so that rounding in
        summation order never lets an assignment judged to fit here exceed the original.
        Integral usages and limit (IOPDDL's) sum exactly and keep the limit as is."""
        limit = self.problem.limit
        if limit is None:
            return np.inf
        limit = float(limit)
        return limit if self.integral else limit - 1e-9 * abs(limit)

    def split(self, flat: np.ndarray) -> list[np.ndarray]:
        """Per-node views of a flat strategy vector."""
        return [flat[self.offsets[i]:self.offsets[i + 1]] for i in range(self.num_nodes)]

    def objective(self, x: np.ndarray) -> float:
        """Reduced cost of assignment x (offset included)."""
        nodes = self.cost_flat[self.offsets[:-1] + x].sum()
        edges = self.edge_flat[self.edge_off + x[self.edge_a] * self.edge_cols
                               + x[self.edge_b]].sum()
        return float(self.problem.offset + nodes + edges)

    def term_values(self, x: np.ndarray) -> np.ndarray:
        return self.term_flat[self.term_off + x[self.term_node]]

    def profile(self, x: np.ndarray) -> np.ndarray:
        """Usage per segment of assignment x."""
        nseg = self.problem.base.size
        values = self.term_values(x)
        diff = (np.bincount(self.term_lo, values, nseg + 1)
                - np.bincount(self.term_hi, values, nseg + 1))
        return self.problem.base + np.cumsum(diff)[:-1]

    def term_prices(self, lam: np.ndarray) -> np.ndarray:
        """Price of each term: the sum of the segment prices over its range."""
        prefix = np.concatenate([[0.0], np.cumsum(lam)])
        return prefix[self.term_hi] - prefix[self.term_lo]

    def priced(self, lam: np.ndarray | None) -> np.ndarray:
        """Flat node costs plus usage times segment price (memory as a cost)."""
        if lam is None or self.term_node.size == 0:
            return self.cost_flat.copy()
        return self.priced_terms(self.term_prices(lam))

    def priced_terms(self, prices: np.ndarray) -> np.ndarray:
        """Flat node costs plus each term's usage times its own price per byte."""
        per_cell = np.repeat(prices, self.sizes[self.term_node])
        extra = np.bincount(self.term_pos, per_cell * self.term_flat, self.cost_flat.size)
        return self.cost_flat + extra

    @functools.cached_property
    def neighbour_ids(self) -> tuple[list[int], ...]:
        """Per node, its neighbours' indices as plain ints (for Python-level loops)."""
        return tuple([int(j) for j, _ in n] for n in self.nbrs)

    def with_neighbours(self, x: np.ndarray, costs: np.ndarray,
                        outside: np.ndarray | None = None) -> np.ndarray:
        """Flat vector: `costs` plus each strategy's edge costs to its neighbours as in x
        (only to the neighbours marked in `outside`, when given): `local` for every node
        at once."""
        paid = self.edge_flat[self.pay_base + x[self.pay_other] * self.pay_stride]
        if outside is not None:
            paid = np.where(outside[self.pay_other], paid, 0.0)
        return costs + np.bincount(self.pay_cell, paid, costs.size)

    def node_minimum(self, values: np.ndarray) -> np.ndarray:
        """Per node, the least entry of its strategies in a flat vector."""
        if self.num_nodes == 0:
            return np.zeros(0)
        return np.minimum.reduceat(values, self.offsets[:-1])

    def local(self, i: int, x: np.ndarray, costs: np.ndarray) -> np.ndarray:
        """Cost of each strategy of node i with every other node fixed as in x."""
        out = costs[self.offsets[i]:self.offsets[i + 1]].copy()
        for j, m in self.nbrs[i]:
            out += m[:, x[j]]
        return out

    def node_usage_at(self, i: int) -> list[tuple[int, int, np.ndarray]]:
        """Usage terms (lo, hi, vec) of node i."""
        idx = np.flatnonzero(self.term_node == i)
        return [(int(self.term_lo[t]), int(self.term_hi[t]),
                 self.term_flat[self.term_off[t]:self.term_off[t] + self.sizes[i]]) for t in idx]


def _ranges(sizes: np.ndarray) -> np.ndarray:
    """0..n-1 for every n in `sizes`, concatenated."""
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    return np.arange(int(sizes.sum()), dtype=np.int64) - starts
