"""A priced problem as a weighted CSP, solved by toulbar2's branch and bound.

Memory priced per byte (`Flat.priced_terms`) turns the problem into a pairwise cost
network without constraints: one variable per node, a unary table per node (its costs
plus the prices of its usage) and a binary table per edge. toulbar2 (pytoulbar2) solves
such networks with soft arc consistency and hybrid best-first search; within a few
seconds it returns assignments of the priced costs far below what forest moves and
TRW-S reach (IOPDDL's S, prices of one per byte: its answer costs 1.43e9 in true costs
at 1.19 times the limit, where the guided search's iterates stay above 1.55e9).

Costs are integers for toulbar2: `Scales` keeps integral costs (IOPDDL's) as they are and
scales fractional ones to about 2**40; infinite costs stay forbidden.
"""

from __future__ import annotations

import numpy as np

from autopar.solver.flat import Flat
from autopar.solver.scaling import Scales

# toulbar2's limited discrepancy search: at most this many choices against its value
# ordering per dive, so that an answer comes early and improves within the time limit.
DISCREPANCIES = 4


def toulbar2_available() -> bool:
    """Whether toulbar2's Python binding imports (a dependency; checked, not assumed)."""
    try:
        import pytoulbar2  # noqa: F401
    except ImportError:
        return False
    return True


class Wcsp:
    """The integer edge tables of a problem, built once as arrays; `answer` adds node
    tables and solves. Built before forking, the children read the arrays without
    copying them (lists of Python floats would be copied page by page as their
    reference counts change)."""

    def __init__(self, flat: Flat) -> None:
        self.flat = flat
        self.scale = Scales.of(flat).cost
        self.tables = [_table(m.ravel(), self.scale) for m in flat.problem.matrices]

    def answer(self, costs: np.ndarray, *, seconds: int, seed: int) -> np.ndarray | None:
        """The best assignment toulbar2 finds for the flat node `costs` (the edges' own)
        within `seconds` (at least 1) from `seed`; None when it found none."""
        import pytoulbar2

        flat = self.flat
        network = pytoulbar2.CFN(vac=0, seed=seed, verbose=-1)
        network.Option.lds = DISCREPANCIES
        for i, size in enumerate(flat.sizes):
            network.AddVariable(f"x{i}", range(int(size)))
        for i, node in enumerate(flat.split(costs)):
            if node.size > 1:
                network.AddFunction([i], _table(node, self.scale).tolist())
        for (a, b), table in zip(flat.problem.edges, self.tables):
            network.AddFunction([a, b], table.tolist())
        found = network.Solve(timeLimit=max(int(seconds), 1))
        return None if found is None else np.asarray(found[0], dtype=np.int64)


def _table(values: np.ndarray, scale: float) -> np.ndarray:
    """`values` as toulbar2 costs: scaled and rounded (infinite ones stay forbidden)."""
    return np.round(values * scale)
