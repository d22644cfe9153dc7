"""Exact reductions on their own: same optimum, same cost and memory after expansion."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from solver_cases import brute_force, random_problem

from autopar.solver import ShardingProblem
from autopar.solver.fold import chain_response, leaf_response, pareto_mask
from autopar.solver.reductions import Infeasible, _beaten, _undominated, reduce_problem


def _all(reduced):
    return itertools.product(*[range(c.size) for c in reduced.costs])


@pytest.mark.parametrize("seed", range(6))
def test_reduced_problem_is_exact(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(15):
        problem = random_problem(rng, ties=bool(rng.random() < 0.3))
        expected = brute_force(problem)
        try:
            reduced = reduce_problem(problem)
        except Infeasible:
            assert math.isinf(expected)
            continue
        best = math.inf
        for x in _all(reduced):
            full = reduced.expand(x)
            cost = reduced.cost(x)
            # Every reduced assignment maps to an original one of the same cost and, when
            # finite (forbidden ones may follow arbitrary responses), the same fit.
            assert problem.cost(full) == cost
            if math.isinf(cost):
                continue
            limit = problem.usage_limit
            fits = limit is None or problem.peak_usage(full) <= limit
            assert reduced.fits(x) == fits
            assert all(len({full[i] for i in g}) == 1 for g in problem.ties)
            if fits and cost < best:
                best = cost
        assert best == expected


def test_chains_and_leaves_disappear_without_memory() -> None:
    rng = np.random.default_rng(3)
    n = 8
    costs = tuple(rng.integers(0, 9, size=3).astype(float) for _ in range(n))
    edges = tuple((i, i + 1) for i in range(n - 1))
    mats = tuple(rng.integers(0, 9, size=(3, 3)).astype(float) for _ in edges)
    problem = ShardingProblem(costs, tuple(np.ones(3) for _ in range(n)),
                              tuple((0, 1) for _ in range(n)), edges, mats, None)
    reduced = reduce_problem(problem)
    assert reduced.num_nodes == 0
    assert problem.cost(reduced.expand([])) == brute_force(problem)


def test_leaf_with_a_memory_trade_off_is_kept() -> None:
    # Strategy 0 is cheaper, strategy 1 uses less memory: no single best response.
    total = np.array([[1.0, 1.0], [2.0, 2.0]])
    usage = np.array([[5.0], [1.0]])
    assert leaf_response(total, usage) is None
    assert pareto_mask(total, usage).all()
    # With equal memory the cheaper one always wins.
    assert list(leaf_response(total, np.ones((2, 1)))) == [0, 0]


def test_chain_response_needs_one_dominant_choice() -> None:
    left, right = np.zeros((2, 2)), np.zeros((2, 2))
    cost = np.array([0.0, 1.0])
    response, best = chain_response(left, cost, right, np.array([[1.0], [2.0]]))
    assert (response == 0).all() and (best == 0).all()
    assert chain_response(left, cost, right, np.array([[2.0], [1.0]])) is None


def test_undominated_segments() -> None:
    # One term over segments 0..2 and one over 1..1: segment 1 implies 0, and 2 when
    # its base is strictly smaller (ties keep one side, so never both of a pair go).
    lo, hi = np.array([0, 1]), np.array([3, 2])
    assert list(_undominated(lo, hi, np.zeros(3))) == [False, True, True]
    assert list(_undominated(lo, hi, np.array([0.0, 0.0, -1.0]))) == [False, True, False]
    assert list(_undominated(lo, hi, np.array([5.0, 0.0, 0.0]))) == [True, True, True]


def test_infeasible_is_detected() -> None:
    problem = ShardingProblem(([1.0, math.inf],), ([3.0, 1.0],), ((0, 1),), (), (), 2.0)
    with pytest.raises(Infeasible):
        reduce_problem(problem)


def _chain_response_by_pairs(left, cost, right, usage):
    """`chain_response`'s contract, pair by pair: the cheapest response (least summed usage
    among equals, then lowest index), which must use no more in any term than any
    finite-cost alternative; None when some pair has none."""
    ka, k = left.shape
    kb = right.shape[1]
    response, best = np.zeros((ka, kb), dtype=np.int64), np.zeros((ka, kb))
    for a in range(ka):
        for b in range(kb):
            total = left[a] + cost + right[:, b]
            best[a, b] = total.min()
            if usage.shape[1] == 0:
                response[a, b] = int(np.argmin(total))
                continue
            cheapest = [i for i in range(k) if total[i] == best[a, b]]
            response[a, b] = min(cheapest, key=lambda i: (usage[i].sum(), i))
            finite = [i for i in range(k) if np.isfinite(total[i])]
            if finite and (usage[response[a, b]] > usage[finite].min(axis=0)).any():
                return None
    return response, best


@pytest.mark.parametrize("side", [(1, 8), (10, 40)], ids=["small", "sampled"])
def test_chain_response_matches_the_pairwise_definition(side) -> None:
    """Random chains, forbidden pairs and ties included; the larger ones go through the
    sampled pre-check."""
    rng = np.random.default_rng(side[0])
    dominant = 0
    for _ in range(150):
        ka, kb = rng.integers(*side, 2)
        k, terms = int(rng.integers(1, 10)), int(rng.integers(0, 4))
        left = rng.integers(0, 6, (ka, k)).astype(float)
        right = rng.integers(0, 6, (k, kb)).astype(float)
        cost = np.sort(rng.integers(0, 4, k).astype(float))
        forbidden = rng.choice([0, 0.02, 0.2])
        for values in (left, right, cost):
            values[rng.random(values.shape) < forbidden] = np.inf
        usage = np.sort(rng.integers(0, 3, (k, terms)).astype(float), axis=0)[::-1].copy()
        expected = _chain_response_by_pairs(left, cost, right, usage)
        found = chain_response(left, cost, right, usage)
        assert (found is None) == (expected is None)
        if expected is not None:
            dominant += 1
            assert np.array_equal(found[0], expected[0])
            assert np.array_equal(found[1], expected[1])
    assert dominant > 20


@pytest.mark.parametrize("seed", range(4))
def test_beaten_matches_the_pairwise_definition(seed: int) -> None:
    """A row is beaten when another is no worse in every column and worse in one, or equal
    with a lower index: checked against all K x K pairs, ties and inf included, on widths
    below, at and past the blocks the filter compares at once."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        k, width = int(rng.integers(2, 25)), int(rng.integers(1, 80))
        features = rng.integers(0, 3, size=(k, width)).astype(float)
        features[rng.random((k, width)) < 0.05] = np.inf
        features = np.repeat(features[: max(1, k // 2)], 2, axis=0)  # exact ties
        expected = [any(j != i and (features[j] <= features[i]).all()
                        and ((features[j] < features[i]).any() or j < i)
                        for j in range(len(features))) for i in range(len(features))]
        assert _beaten(features).tolist() == expected
