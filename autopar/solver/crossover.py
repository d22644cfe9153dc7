"""Crossover: a local optimum improved by the pieces another one got right.

Restarted searches end in different local optima, whose assignments differ on a fifth of
the nodes in about a hundred connected pieces (IOPDDL's S after 60 s, three seeds: 955 to
1,486 of 6,430 reduced nodes, in 97 to 121 pieces). A piece taken whole from the other
optimum is a move no single-node step and no forest move on priced costs makes: the
other search paid, elsewhere, for the memory it frees or takes. `crossed` takes every
piece that lowers the cost and keeps every segment within the limit, smallest first, then
descends (`MemoryMoves.descend`). On those three optima of S (0.9640, 0.9597 and 0.9694
points) the best took 7 pieces from the others and rose to 0.9706, the first 17 and rose
to 0.9686; each crossing took 0.1 s.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from autopar.solver.flat import Flat
from autopar.solver.repair import MemoryMoves

# The restarts' local optima an incumbent is crossed with: the newest this many (a crossing
# of S's takes 0.1 s, a guided run about 25 s).
CROSSED_OPTIMA = 8


def crossed(flat: Flat, moves: MemoryMoves, x: np.ndarray, donor: np.ndarray) -> np.ndarray:
    """`x` (which fits) with each connected piece of the nodes where `donor` chose otherwise
    (connected by `flat`'s edges) taken from `donor` where that lowers the objective and
    keeps every segment within the limit, smallest piece first (ties by their least node),
    then one pass of memory-safe descent. Deterministic; never dearer than `x`."""
    x = x.copy()
    differ = np.flatnonzero(x != donor)
    graph = nx.Graph()
    graph.add_nodes_from(differ.tolist())
    inside = set(graph.nodes)
    graph.add_edges_from((int(i), j) for i in differ for j, _ in flat.nbrs[int(i)]
                         if j in inside)
    pieces = sorted((sorted(piece) for piece in nx.connected_components(graph)),
                    key=lambda piece: (len(piece), piece[0]))
    profile, cost = flat.profile(x), flat.objective(x)
    for piece in pieces:
        before = x[piece].copy()
        for i in piece:
            moves.switch(i, int(donor[i]), x, profile)
        taken = flat.objective(x)
        if taken < cost and (profile <= flat.limit).all():
            cost = taken
            continue
        for i, k in zip(piece, before):
            moves.switch(i, int(k), x, profile)
    return moves.descend(x, flat.cost_flat, np.arange(flat.num_nodes))
