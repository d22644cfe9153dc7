"""Which memory constraints to give CP-SAT: the ones that can bind, not all of them.

A reduced problem may have tens of thousands of segments; CP-SAT only needs those that an
assignment near the current one could push over the limit. Segments are picked from the
current profile and the most the free nodes could add; a solution that still breaks an
unpicked segment is caught by the caller (which checks the full profile) and that segment
is added before the next solve, so the final answer always fits.
"""

from __future__ import annotations

import numpy as np

from autopar.solver.flat import Flat


def headroom_needed(flat: Flat, x: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Per segment, the most the free nodes' usage could rise above its value in x."""
    nseg = flat.problem.base.size
    rise = np.zeros(nseg + 1)
    terms = np.flatnonzero(free[flat.term_node])
    for t in terms:
        i = flat.term_node[t]
        vec = flat.term_flat[flat.term_off[t]:flat.term_off[t] + flat.sizes[i]]
        extra = float(vec.max() - vec[x[i]])
        if extra > 0:
            rise[flat.term_lo[t]] += extra
            rise[flat.term_hi[t]] -= extra
    return np.cumsum(rise)[:-1]


def binding_segments(flat: Flat, x: np.ndarray, free: np.ndarray,
                     cap: int) -> np.ndarray:
    """Segments that free nodes could push over the limit, at most `cap` of them.

    Within a run of segments where no free term starts or ends, only the fullest one
    matters (the free part of the sum is the same on all of them), so one per run is kept;
    if more than `cap` runs qualify, the fullest runs are kept.
    """
    if not np.isfinite(flat.limit) or flat.problem.base.size == 0:
        return np.zeros(0, dtype=np.int64)
    prof = flat.profile(x)
    risky = prof + headroom_needed(flat, x, free) > flat.limit
    ft = np.flatnonzero(free[flat.term_node])
    cuts = np.unique(np.concatenate([[0], flat.term_lo[ft], flat.term_hi[ft]]))
    cuts = cuts[cuts < prof.size]
    score = np.where(risky, prof, -np.inf)
    run_max = np.maximum.reduceat(score, cuts)
    ends = np.append(cuts[1:], prof.size)
    picks = [int(a + np.argmax(score[a:b])) for a, b, m in zip(cuts, ends, run_max)
             if np.isfinite(m)]
    picks_arr = np.asarray(picks, dtype=np.int64)
    if picks_arr.size > cap:
        top = np.argsort(-prof[picks_arr], kind="stable")[:cap]
        picks_arr = np.sort(picks_arr[top])
    return picks_arr


def memory_cells(flat: Flat, segments: np.ndarray) -> int:
    """Nonzeros of the memory rows on `segments` (terms live there times strategies)."""
    chosen = np.unique(np.asarray(segments, dtype=np.int64))
    covered = np.searchsorted(chosen, flat.term_hi) - np.searchsorted(chosen, flat.term_lo)
    return int((covered * flat.sizes[flat.term_node]).sum())
