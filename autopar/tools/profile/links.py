"""What the links of a mesh move, measured on every rank at once: each collective kind
over each mesh axis's process groups, per message size, and how much of a collective
running beside compute that compute hides.

The collectives are the runtime's own steps (`autopar.runtime.axis_ops.apply_step`: torch.
distributed's blocking all-reduce of a copy, all-gather and reduce-scatter into one
tensor, all-to-all of the stacked pieces, with the runtime's copies and bookkeeping), and
a send and receive between pairs of ranks, as pipeline stages and attention rings
exchange. The message size is the per-rank buffer B of
`autopar.costs.formulas`: the gathered output of an all-gather, the input of a reduce-
scatter. Every timing starts after a barrier over the group and a short burst of compute
(`_timed_collective`); the ranks' k-th timings are combined as the slowest's.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from autopar.runtime.axis_ops import apply_step
from autopar.runtime.counter import CommCounter
from autopar.runtime.steps import Step
from autopar.tools.profile.timing import Timing
from autopar.values.placement import Partial, Replicate, Shard

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send")
# Untimed calls before a collective's timings: its first calls set up buffers and pairs.
WARM_UP = 3
# A message this large or larger is timed fewer times (each takes a good part of a second);
# one below SMALL_BYTES more times: its mean is a latency with a long tail (a peer woken
# late by the scheduler), which takes many samples to settle.
LARGE_BYTES = 64 * 2**20
SMALL_BYTES = 2**20
SMALL_REPEATS = 8
OVERLAP_MATMUL = 384
BURST_MATMUL = 192
# Four all-reduces of this size take about as long as the matmuls on CPU processes.
OVERLAP_BYTES = 2**18


# The placements the runtime converts for each kind (`autopar.runtime.axis_ops.apply_step`,
# its copies included: the all-reduce's copy of a shared input, the all-to-all's pieces).
_STEPS = {"all_reduce": (Partial(), Replicate()), "all_gather": (Shard(0), Replicate()),
          "reduce_scatter": (Partial(), Shard(0)), "all_to_all": (Shard(0), Shard(1))}


def _call(kind: str, nbytes: int, mesh, name: str, n: int, position: int):
    """A zero-argument call of one `kind` collective of `nbytes` over mesh axis `name`, as
    the runtime converts a tensor (a send and receive between a pair of ranks for
    "send")."""
    group = mesh.get_group(name)
    elements = max(n, nbytes // 4 // n * n)
    if kind == "send":
        return _exchange(elements, group, position)
    local = {"all_gather": (elements // n,),
             "all_to_all": (n, max(n, elements // n // n * n))}.get(kind, (elements,))
    axis, (src, dst) = mesh.mesh_dim_names.index(name), _STEPS[kind]
    shape = (local[0] * n, *local[1:]) if isinstance(src, Shard) else local
    before = tuple(src if a == axis else Replicate() for a in range(mesh.ndim))
    step = Step(axis, src, dst, shape, before)
    tensor, counter = torch.zeros(local), CommCounter()
    return lambda: apply_step(tensor, step, mesh, counter, "forward")


def _exchange(elements: int, group, position: int):
    peer = dist.get_global_rank(group, position ^ 1)
    sent, received = torch.zeros(elements), torch.empty(elements)

    def exchange() -> None:
        ops = [dist.P2POp(dist.isend, sent, peer, group), dist.P2POp(dist.irecv, received,
                                                                      peer, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return exchange


def _timed_collective(call, group, repeats: int) -> Timing:
    """`call` timed after a barrier and a short burst of compute on every rank: in a
    training step a collective follows compute, not an idle wait, and its time includes
    waiting for a peer that is still computing."""
    seconds = []
    burst = torch.randn(BURST_MATMUL, BURST_MATMUL)
    for index in range(repeats + WARM_UP):
        dist.barrier(group=group)
        torch.mm(burst, burst)
        start = time.perf_counter()
        call()
        if index >= WARM_UP:
            seconds.append(time.perf_counter() - start)
    return Timing.of(seconds)


def axis_figures(mesh, name: str, n: int, settings) -> dict[str, dict[int, Timing]]:
    """Timings of every kind over mesh axis `name` of `n` devices, per message size. Sends
    pair group ranks 2k and 2k+1 (an odd last rank of the group sits out, so a group of
    odd size has no send figures)."""
    group = mesh.get_group(name)
    position = dist.get_group_rank(group, dist.get_rank())
    figures: dict[str, dict[int, Timing]] = {}
    for kind in KINDS:
        if kind == "send" and n % 2:
            continue
        figures[kind] = {}
        for nbytes in settings.message_bytes:
            repeats = (SMALL_REPEATS * settings.repeats if nbytes < SMALL_BYTES
                       else settings.repeats if nbytes < LARGE_BYTES
                       else max(3, settings.repeats // 3))
            call = _call(kind, nbytes, mesh, name, n, position)
            figures[kind][nbytes] = _timed_collective(call, group, repeats)
    return figures


def overlap_figures(repeats: int) -> tuple[Timing, Timing, Timing]:
    """(matmuls alone, all-reduces over every rank alone, both started together and waited
    for): what running communication in the background of compute really hides, as a
    step's overlapped gradient reductions and parameter gathers run. On a GPU they share
    the device's memory bandwidth; on CPU processes they share the cores, so the
    collective's copies and sums take time from the compute beside it."""
    a = torch.randn(OVERLAP_MATMUL, OVERLAP_MATMUL)
    buffers = [torch.zeros(OVERLAP_BYTES // 4) for _ in range(4)]

    def compute() -> None:
        for _ in range(8):
            torch.mm(a, a)

    def communicate() -> None:
        for work in [dist.all_reduce(b, async_op=True) for b in buffers]:
            work.wait()

    def together() -> None:
        works = [dist.all_reduce(b, async_op=True) for b in buffers]
        compute()
        for work in works:
            work.wait()

    # One call per timing on every rank (`timed` would let each rank choose its own count,
    # and ranks calling collectives a different number of times wait for each other).
    return tuple(_timed_collective(run, None, repeats)
                 for run in (compute, communicate, together))
