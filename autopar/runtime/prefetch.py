"""Parameter gathers started one use ahead of it, so that they overlap the compute between.

A parameter stored sharded (ZeRO-3, or ZeRO-2 kept gathered) is all-gathered where an op
uses it. Done there, the gather blocks the forward; FSDP instead starts the next layer's
gather while the current layer computes. The lowering chains the rank program's parameter
gathers in program order (`prefetchable` edges): each one, when it runs, takes its own
gather (started by the one before, else it gathers now) and starts the next's, whose shard
the program passes it. The collectives run in the same order on every rank, as the program
is the same; each is recorded once, when it starts. Between the start and the use one more
gathered parameter is alive than without prefetching.

`Prefetch` holds the gathers in flight of one run of the program; `begin` drops (after
waiting) any a run left behind, so a gather is never used across an optimizer step.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh

from autopar.runtime.axis_ops import apply_steps, axis_name, start_all_gather
from autopar.runtime.counter import CommCounter
from autopar.runtime.redistribution import Redistribution


def prefetchable(redistribution: Redistribution) -> bool:
    """Edges whose forward's one collective is an all-gather (with local steps around it):
    it can start before the use, from the shard alone. The planner charges the same
    edges' gathers as overlapped (`edge_costs.background_gathers`)."""
    kinds = [step.kind for step in redistribution.forward_steps if step.kind is not None]
    return kinds == ["all_gather"]


def _gather_at(redistribution: Redistribution) -> int:
    return next(i for i, step in enumerate(redistribution.forward_steps) if step.kind)


class Prefetch:
    """The gathers started ahead of their use in one run of a rank program (by edge key):
    a plain object the rank's context owns."""

    def __init__(self) -> None:
        self._started: dict[int, tuple[torch.Tensor, object, Redistribution, DeviceMesh,
                                       CommCounter]] = {}

    def begin(self) -> None:
        """Start a run of the program: forget gathers an earlier run left unused."""
        for _, work, *_ in self._started.values():
            work.wait()
        self._started.clear()

    def start(self, key: int, shard: torch.Tensor, redistribution: Redistribution,
              mesh: DeviceMesh, counter: CommCounter) -> None:
        """Start gathering `shard` for the `prefetchable` edge `key` (after the local steps
        before the gather), recording it now."""
        at = _gather_at(redistribution)
        step = redistribution.forward_steps[at]
        local = apply_steps(shard.detach(), redistribution.forward_steps[:at], mesh, counter,
                            "forward")
        out, work, nbytes = start_all_gather(local, step, mesh)
        counter.record("all_gather", axis_name(mesh, step.axis), "forward", nbytes)
        self._started[key] = (out, work, redistribution, mesh, counter)

    def take(self, key: int) -> torch.Tensor | None:
        """The converted tensor of edge `key` if its gather was started, else None."""
        entry = self._started.pop(key, None)
        if entry is None:
            return None
        out, work, redistribution, mesh, counter = entry
        work.wait()
        after = redistribution.forward_steps[_gather_at(redistribution) + 1:]
        return apply_steps(out, after, mesh, counter, "forward")
