"""Best responses of a node to its neighbours, the arithmetic behind node elimination.

A node whose choice can be decided once its neighbours' choices are known can be removed
exactly: its best response is folded into the neighbours. With memory limits that is only
exact when, for every neighbour choice, one response is at least as good as every other in
cost *and* in every usage term (a single Pareto-optimal response); otherwise the cheaper
response might not fit in memory. These functions compute such responses, or say None.
"""

from __future__ import annotations

import numpy as np

# Largest broadcast (in elements) a single fold may build; bigger nodes are left alone.
MAX_CELLS = 20_000_000
# Pairs of neighbour choices a chain's response is first checked on (a grid of
# SAMPLED_SIDE rows by columns), when it has more of them than SAMPLED_PAIRS.
SAMPLED_SIDE = 8
SAMPLED_PAIRS = 256


def pareto_mask(total: np.ndarray, usage: np.ndarray) -> np.ndarray | None:
    """Which strategies are Pareto-optimal for some neighbour choice.

    `total` is K x P (cost of strategy k when the neighbour picks p), `usage` K x T.
    Returns a K x P boolean mask: [k, p] when k is on the Pareto front of (cost, usage)
    for neighbour choice p (ties keep the lowest index), or None when too big to compute.
    """
    k, p = total.shape
    if k * k * p > MAX_CELLS:
        return None
    finite = np.isfinite(total)
    usage_le = (usage[:, None, :] <= usage[None, :, :]).all(axis=2)  # [k', k]
    usage_eq = (usage[:, None, :] == usage[None, :, :]).all(axis=2)
    cost_le = total[:, None, :] <= total[None, :, :]  # [k', k, p]
    cost_eq = total[:, None, :] == total[None, :, :]
    lower = np.arange(k)[:, None] < np.arange(k)[None, :]
    # k' beats k: weakly better everywhere, and strictly somewhere or an earlier equal.
    equal = cost_eq & usage_eq[:, :, None]
    beats = cost_le & usage_le[:, :, None] & (~equal | lower[:, :, None])
    beats &= finite[:, None, :]
    beats[np.arange(k), np.arange(k), :] = False
    return finite & ~beats.any(axis=0)


def leaf_response(total: np.ndarray, usage: np.ndarray) -> np.ndarray | None:
    """Per neighbour choice p, the single dominant strategy of a leaf, or None if none.

    Contract as `pareto_mask`; the response is 0 where no strategy has finite cost.
    """
    if usage.shape[1] == 0:
        return np.argmin(total, axis=0)
    front = pareto_mask(total, usage)
    if front is None or (front.sum(axis=0) > 1).any():
        return None
    return np.argmax(front, axis=0)


def chain_response(left: np.ndarray, cost: np.ndarray, right: np.ndarray,
                   usage: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Best response of a degree-2 node to the pair (a, b) of its neighbours' choices.

    `left` is Ka x K (edge a-node), `right` K x Kb (edge node-b), `cost` K, `usage` K x T.
    Returns (response Ka x Kb, folded edge cost Ka x Kb), or None when no single dominant
    response exists for some pair or the arrays would be too big.
    """
    ka, k = left.shape
    kb = right.shape[1]
    if ka * k * kb * max(usage.shape[1], 1) > MAX_CELLS:
        return None
    if usage.shape[1] and ka * kb > SAMPLED_PAIRS:
        # Most nodes under a memory limit have no dominant response: a failure on a few
        # pairs of neighbour choices says so without building every pair's responses.
        rows, cols = sampled_pairs(ka, kb)
        if _dominant_response(left[rows], cost, right[:, cols], usage) is None:
            return None
    return _dominant_response(left, cost, right, usage)


def sampled_pairs(ka: int, kb: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns): a grid of at most SAMPLED_SIDE x SAMPLED_SIDE neighbour choices,
    spread over `ka` x `kb`, on which a chain's response is checked first."""
    return tuple(np.unique(np.linspace(0, n - 1, SAMPLED_SIDE).astype(int)) for n in (ka, kb))


def _dominant_response(left: np.ndarray, cost: np.ndarray, right: np.ndarray,
                       usage: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """`chain_response` without the size check."""
    if usage.shape[1]:
        # Strategies in increasing summed usage (stable): the first cheapest is then the
        # cheapest with the least usage, the lowest index among equals.
        order = np.argsort(usage.sum(axis=1), kind="stable")
        left, cost, right, usage = left[:, order], cost[order], right[order], usage[order]
    # ka, kb, k: the node's choice last, so the reductions over it read contiguous memory.
    total = left[:, None, :] + cost[None, None, :] + right.T[None, :, :]
    response = np.argmin(total, axis=2)
    best = np.take_along_axis(total, response[..., None], axis=2)[..., 0]
    if usage.shape[1] == 0:
        return response, best
    # The response must use no more memory in any term than any finite-cost alternative,
    # whose least usage is every strategy's where all are finite (most pairs), else
    # counted over the finite ones of that pair only.
    chosen = usage[response]  # ka, kb, T
    least = np.broadcast_to(usage.min(axis=0), chosen.shape).copy()
    partial = ~np.isfinite(left).all(axis=1)[:, None] | ~np.isfinite(right).all(axis=0)[None, :]
    if not np.isfinite(cost).all():
        partial[:] = True
    rows, cols = np.nonzero(partial)
    if rows.size:
        finite = np.isfinite(total[rows, cols])  # pairs, k
        for term in range(usage.shape[1]):
            # The first finite strategy in increasing usage of the term is the least.
            by_usage = np.argsort(usage[:, term], kind="stable")
            first = np.argmax(finite[:, by_usage], axis=1)
            least[rows, cols, term] = np.where(finite.any(axis=1),
                                               usage[by_usage[first], term], np.inf)
    ok = np.isfinite(best)[..., None] <= (chosen <= least)
    if not ok.all():
        return None
    return order[response], best
