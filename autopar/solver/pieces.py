"""Memory rows for a set of segments, split into what is fixed and what the free nodes add.

For the chosen segments (indices into the reduced problem's segments, sorted), the usage
of nodes that are not free is a constant per segment; a free node contributes through
*pieces*: runs of consecutive chosen segments on which the same terms of the node are live,
with the summed usage vector of those terms. A model then needs one usage variable per
piece instead of one coefficient per strategy per segment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.solver.flat import Flat


@dataclass(frozen=True)
class Piece:
    """Node `node` uses `usage[k]` (strategy k) on chosen segments first .. last - 1."""

    node: int
    first: int
    last: int
    usage: np.ndarray


def memory_pieces(flat: Flat, x: np.ndarray, free: np.ndarray,
                  chosen: np.ndarray) -> tuple[np.ndarray, list[Piece]]:
    """Fixed usage per chosen segment (base included) and the free nodes' pieces."""
    first = np.searchsorted(chosen, flat.term_lo)
    last = np.searchsorted(chosen, flat.term_hi)
    covered = last > first
    fixed_terms = covered & ~free[flat.term_node]
    values = flat.term_values(x)[fixed_terms]
    diff = (np.bincount(first[fixed_terms], values, chosen.size + 1)
            - np.bincount(last[fixed_terms], values, chosen.size + 1))
    fixed = flat.problem.base[chosen] + np.cumsum(diff)[:-1]
    free_terms = np.flatnonzero(covered & free[flat.term_node])
    order = free_terms[np.argsort(flat.term_node[free_terms], kind="stable")]
    nodes = flat.term_node[order]
    starts = np.flatnonzero(np.r_[True, nodes[1:] != nodes[:-1]]) if order.size else []
    pieces: list[Piece] = []
    for a, b in zip(starts, np.r_[starts[1:], order.size] if order.size else []):
        ts = order[a:b]
        i = int(flat.term_node[ts[0]])
        size = int(flat.sizes[i])
        vecs = flat.term_flat[flat.term_off[ts][:, None] + np.arange(size)[None, :]]
        if ts.size == 1:
            pieces.append(Piece(i, int(first[ts[0]]), int(last[ts[0]]), vecs[0]))
            continue
        cuts = np.unique(np.concatenate([first[ts], last[ts]]))
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            on = (first[ts] <= lo) & (lo < last[ts])
            if on.any():
                pieces.append(Piece(i, int(lo), int(hi), vecs[on].sum(axis=0)))
    return fixed, pieces
