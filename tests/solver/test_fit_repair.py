"""`fit_repair.repair_to_fit`: an overflowing answer of a problem with edge usages moved,
tie group by tie group, to one that fits, by the least added cost per byte freed."""

from __future__ import annotations

import numpy as np
from solver_cases import halfway_limited

from autopar.solver.fit_repair import repair_to_fit
from autopar.solver.problem import EdgeUsage, ShardingProblem


def test_the_move_freeing_bytes_most_cheaply_is_taken():
    # Node 0 (a producer) and node 1 (its consumer), both live over [0, 2). Kept as they
    # are (0, 0) they overflow through the edge usage; moving node 1 to strategy 1 frees
    # 6 bytes for 3 more cost (0.5 a byte), to strategy 2 frees 8 for 8 (1 a byte), and
    # moving node 0 to strategy 1 frees 6 for 6: strategy 1 of node 1 is the repair.
    problem = ShardingProblem(
        node_costs=(np.array([0.0, 6.0]), np.array([0.0, 3.0, 8.0])),
        node_usages=(np.array([2.0, 2.0]), np.array([2.0, 2.0, 2.0])),
        intervals=((0, 2), (0, 2)), edges=((0, 1),), edge_costs=(np.zeros((2, 3)),),
        usage_limit=6.0,
        edge_usages=(EdgeUsage((0, 1), np.array([[8.0, 2.0, 0.0], [2.0, 2.0, 0.0]]),
                               (1, 2)),))
    assert not problem.is_feasible((0, 0))
    assert repair_to_fit(problem, (0, 0), seconds=5.0) == (0, 1)


def test_repaired_answers_fit_and_keep_their_ties():
    rng = np.random.default_rng(11)
    repaired = tried = 0
    for problem, _, cheapest in halfway_limited(rng, 150):
        tried += 1
        answer = repair_to_fit(problem, cheapest, seconds=5.0)
        if answer is not None:
            repaired += 1
            assert problem.is_feasible(answer)  # fits, finite, ties respected
    assert tried >= 30 and repaired >= tried // 2
