"""A rank program run under torchrun by the launch tests: `fn(rank)` + `init_from_env()`."""

from __future__ import annotations

import torch
import torch.distributed as dist

import autopar
from autopar.runtime import CommCounter, Redistribution, device_mesh, init_from_env, redistribute
from autopar.values.placement import Replicate, Shard


def main(rank: int) -> None:
    mesh = device_mesh(autopar.Mesh((2,), ("x",)))
    edge = Redistribution.for_edge((4,), torch.float64, (Shard(0),), (Replicate(),),
                                   (Replicate(),), (2,))
    x = torch.arange(4, dtype=torch.float64).chunk(2)[rank]
    counter = CommCounter()
    out = redistribute(x, edge, mesh, counter)
    print(f"rank {rank} of {dist.get_world_size()}: {out.tolist()} {counter.totals()}",
          flush=True)


if __name__ == "__main__":
    main(init_from_env())
    dist.destroy_process_group()
