"""What the links of a mesh move, measured on every rank at once: each collective kind
over each mesh axis's process groups, per message size, and how much a collective running
beside compute slows that compute.

The collectives are the runtime's own steps (`autopar.runtime.axis_ops.apply_step`: torch.
distributed's blocking all-reduce of a copy, all-gather and reduce-scatter into one
tensor, all-to-all of the stacked pieces, with the runtime's copies and bookkeeping), and
a send and receive between pairs of ranks, as pipeline stages and attention rings
exchange. The message size is the per-rank buffer B of
`autopar.costs.formulas`: the gathered output of an all-gather, the input of a reduce-
scatter.

Each sample of a collective is one batch of calls (`_sample`), each after a barrier of
its group and a short burst of compute, timed call by call and averaged. A round takes one
sample of every collective in turn, and the samples are the rounds' (`link_figures`):
what moves a collective's time on cores shared by the ranks (their placement on the
cores, the load beside them) changes over seconds, so samples taken back to back share
it, and samples spread over the whole measurement average it out.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from autopar.runtime.axis_ops import apply_step
from autopar.runtime.counter import CommCounter
from autopar.runtime.steps import Step
from autopar.tools.profile.timing import Timing
from autopar.values.placement import Partial, Replicate, Shard

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send")
# The least time of the calls in one sample of a collective: shorter than a kernel's
# timing (`MIN_TIMING_S`), since what moves a collective's time most changes over seconds
# (see the module docstring), which more samples spread over the run average out better
# than longer ones.
BATCH_S = 0.025
OVERLAP_MATMUL = 384
BURST_MATMUL = 192
OVERLAP_BYTES = 8 * 2**20
OVERLAP_SAMPLES = 3


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
    step = Step(mesh.mesh_dim_names.index(name), *_STEPS[kind])
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


def _after_burst(call, group, burst: torch.Tensor) -> float:
    """Seconds of `call` after a barrier of `group` and a short burst of compute: in a
    training step a collective follows compute, not an idle wait, and its time includes
    waiting for a peer that is still computing. (Without the barrier, back-to-back calls
    measure another regime: a gloo send and receive of 4 KiB between 2 ranks on 2 cores
    took 0.2 ms after a barrier and 4 ms without.)"""
    dist.barrier(group=group)
    torch.mm(burst, burst)
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _batch_calls(call, group, burst: torch.Tensor) -> int:
    """The calls of `call` in one sample: enough to last `BATCH_S`, by the time of one call
    after an untimed one (which sets up the group's buffers and pairs); the most any rank
    of `group` asks for, since every rank of a group makes the same calls."""
    _after_burst(call, group, burst)
    once = _after_burst(call, group, burst)
    calls = torch.tensor([max(1, math.ceil(BATCH_S / max(once, 1e-9)))])
    dist.all_reduce(calls, op=dist.ReduceOp.MAX, group=group)
    return int(calls.item())


def _sample(call, group, calls: int, burst: torch.Tensor) -> float:
    """One sample of a collective: `calls` calls (`_after_burst`), their mean time."""
    return sum(_after_burst(call, group, burst) for _ in range(calls)) / calls


def link_figures(mesh, names: tuple[str, ...], shape: tuple[int, ...], settings
                 ) -> dict[str, dict[str, dict[int, Timing]]]:
    """Timings {axis: {kind: {bytes: Timing}}} of every kind over every mesh axis of more
    than one device, at each of `settings.message_bytes`: `settings.rounds` samples each,
    one a round (see the module docstring). Sends pair group ranks 2k and 2k+1 (an odd
    last rank of the group sits out, so a group of odd size has no send figures). Every
    rank runs the same cases in the same order, as its groups' collectives need."""
    burst = torch.randn(BURST_MATMUL, BURST_MATMUL)
    cases = [(name, kind, nbytes) for name, n in zip(names, shape) if n > 1
             for kind in KINDS if not (kind == "send" and n % 2)
             for nbytes in settings.message_bytes]
    sizes = dict(zip(names, shape))

    # Each sample's tensors are made afresh: every case's held at once would take hundreds
    # of MB per rank.
    def made(case):
        name, kind, nbytes = case
        group = mesh.get_group(name)
        position = dist.get_group_rank(group, dist.get_rank())
        return _call(kind, nbytes, mesh, name, sizes[name], position), group

    calls = {case: _batch_calls(*made(case), burst) for case in cases}
    samples: dict = {case: [] for case in cases}
    for _ in range(settings.rounds):
        for case in cases:
            samples[case].append(_sample(*made(case), calls[case], burst))
    figures: dict = {}
    for (name, kind, nbytes), seconds in samples.items():
        figures.setdefault(name, {}).setdefault(kind, {})[nbytes] = Timing.of(seconds)
    return figures


def overlap_figures(repeats: int) -> tuple[Timing, Timing]:
    """(matmuls alone, the same matmuls while all-reduces over every rank run beside
    them): the second over the first, less one, is how much communication slows compute.
    They are sampled in pairs, alone then beside, each after a barrier of every rank, so
    that the two samples of a pair find the cores in the same state (the load beside the
    mesh changes over seconds); `OVERLAP_SAMPLES` pairs per repeat, each sample one burst
    of matmuls (tens of ms)."""
    a = torch.randn(OVERLAP_MATMUL, OVERLAP_MATMUL)
    buffers = [torch.zeros(OVERLAP_BYTES // 4) for _ in range(4)]

    def compute() -> float:
        start = time.perf_counter()
        for _ in range(8):
            torch.mm(a, a)
        return time.perf_counter() - start

    def alone() -> float:
        dist.barrier()
        return compute()

    def beside() -> float:
        dist.barrier()
        works = [dist.all_reduce(b, async_op=True) for b in buffers]
        elapsed = compute()
        for work in works:
            work.wait()
        return elapsed

    alone(), beside()  # the first all-reduces set up gloo's buffers
    pairs = [(alone(), beside()) for _ in range(OVERLAP_SAMPLES * repeats)]
    return Timing.of([p[0] for p in pairs]), Timing.of([p[1] for p in pairs])
