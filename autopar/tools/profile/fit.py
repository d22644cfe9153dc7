"""Fits of measured times to the cost model's formulas (`autopar.costs.formulas`).

Every formula is affine in the size, t = a + b x, so each fit is a least squares line;
it weighs each point by 1 / t^2 (relative residuals), so that small sizes, where the
intercept (latency, overhead) dominates, count as much as large ones:

    collective over n devices, B bytes    t = s alpha + s/n B / beta   (s = the kind's steps:
                                          2(n-1) all-reduce, n-1 all-gather, reduce-scatter,
                                          all-to-all; 1 and n = 1 for a send)
    kernel of F FLOPs or bytes            t = overhead + F / rate
    optimizer step of k tensors, e elements each   t / k = t_tensor + e t_element

(and `exposed_share`, what of background communication compute does not hide).

A collective's timings are also kept as they are, made non-decreasing in the size
(`monotone`): the cost model reads between them (`CollectiveFit.time`).
"""

from __future__ import annotations

from collections.abc import Mapping

from autopar.errors import HardwareError


def line(points: Mapping[float, float]) -> tuple[float, float]:
    """(intercept, slope) of t = a + b x through `points` {x: t}, by least squares on
    relative residuals; a negative intercept (noise at small sizes) reads as 0, with the
    slope refitted through the origin."""
    weights = {x: 1 / t**2 for x, t in points.items()}
    total = sum(weights.values())
    mean_x = sum(w * x for x, w in weights.items()) / total
    mean_t = sum(w * points[x] for x, w in weights.items()) / total
    spread = sum(w * (x - mean_x) ** 2 for x, w in weights.items())
    slope = sum(w * (x - mean_x) * (points[x] - mean_t) for x, w in weights.items()) / spread
    intercept = mean_t - slope * mean_x
    if intercept < 0:
        intercept = 0.0
        slope = sum(w * x * points[x] for x, w in weights.items()) / sum(
            w * x * x for x, w in weights.items())
    if slope <= 0:
        raise HardwareError("measured times do not grow with the size",
                            expected="times that grow with the bytes or FLOPs",
                            got=", ".join(f"{x:g}: {t:.3g} s" for x, t in points.items()),
                            fix="profile again on a machine less loaded, or with more repeats")
    return intercept, slope


def collective_steps(kind: str, n: int) -> tuple[int, int]:
    """(latency steps s, bandwidth divisor d) of the formula t = s alpha + s/d B / beta."""
    if kind == "send":
        return 1, 1
    return (2 * (n - 1) if kind == "all_reduce" else n - 1), n


def collective_fit(kind: str, n: int, timings: Mapping[int, float]) -> tuple[float, float]:
    """(latency alpha, bandwidth beta) of `kind` over `n` devices from its times per message
    size in bytes (the per-rank buffer B of `autopar.costs.formulas`)."""
    steps, divisor = collective_steps(kind, n)
    intercept, slope = line(timings)
    return intercept / steps, steps / divisor / slope


def alpha_beta(ranks: int, timings: Mapping[int, float]) -> tuple[float, float]:
    """(latency, bandwidth) of a link from all-reduce times over `ranks` devices."""
    return collective_fit("all_reduce", ranks, timings)


def monotone(points: Mapping[float, float]) -> list[tuple[float, float]]:
    """`points` {x: t} by increasing x with t made non-decreasing: the least-squares
    non-decreasing fit (adjacent points that fall are pooled into their mean), so that
    noise at small sizes never makes a larger message cheaper than a smaller one."""
    pools: list[list[float]] = []  # [sum of t, count] of each run of pooled points
    for _, t in sorted(points.items()):
        pools.append([t, 1])
        while len(pools) > 1 and pools[-2][0] / pools[-2][1] > pools[-1][0] / pools[-1][1]:
            total, count = pools.pop()
            pools[-1][0] += total
            pools[-1][1] += count
    values = [total / count for total, count in pools for _ in range(count)]
    return list(zip(sorted(points), values))


def exposed_share(compute: float, communicate: float, together: float) -> float:
    """The share of background communication that compute beside it does not hide, from
    the seconds of the compute alone C, the communication alone G and both run together T:

        s = (T - max(C, G)) / min(C, G)      clamped to [0, 1]

    0 when the shorter hides entirely under the longer, 1 when they take as long as one
    after the other (or longer: contention hides nothing either)."""
    shorter = min(compute, communicate)
    if shorter <= 0:
        return 0.0
    return min(1.0, max(0.0, (together - max(compute, communicate)) / shorter))
