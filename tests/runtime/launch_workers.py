"""Rank bodies for the launch tests (module level, so spawned processes can import them)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

import autopar
from autopar.runtime import (
    CommCounter,
    ProcessGroupError,
    Redistribution,
    RedistributionError,
    device_mesh,
    init_from_env,
    redistribute,
)
from autopar.values.placement import Replicate, Shard

R, S0 = Replicate(), Shard(0)


def _error_of(call) -> str:
    try:
        call()
    except RedistributionError as error:
        return type(error).__name__ + ": " + error.what
    return "no error"


def report(rank: int, tag: str) -> dict:
    """What a rank sees: environment, meshes, and redistribute's refusals of misuse."""
    env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                      "MASTER_PORT")}
    try:
        device_mesh(autopar.Mesh((4,), ("x",)))
        mismatch = "no error"
    except ProcessGroupError as error:
        mismatch = str(error)
    mesh = device_mesh(autopar.Mesh((2,), ("x",)))
    counter = CommCounter()
    edge = Redistribution.for_edge((4, 2), torch.float64, (S0,), (R,), (R,), (2,))
    shard = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    errors = {
        "shape": _error_of(lambda: redistribute(torch.zeros(4, 2, dtype=torch.float64), edge,
                                                mesh, counter)),
        "dtype": _error_of(lambda: redistribute(torch.zeros(2, 2), edge, mesh, counter)),
        "no backward": _error_of(lambda: redistribute(shard, Redistribution.for_edge(
            (4, 2), torch.float64, (S0,), (R,), (R,), (2,), requires_grad=False), mesh,
            counter)),
        "no scope": _error_of(lambda: redistribute(shard, Redistribution.for_edge(
            (4, 2), torch.float64, (S0,), (R,), (R,), (2,), regather=True), mesh, counter)),
    }
    return {"rank": rank, "tag": tag, "env": env, "init": init_from_env(),
            "mismatch": mismatch, "coordinate": mesh.get_coordinate(), "errors": errors,
            "counter": counter.totals(), "tensor": torch.full((3,), float(rank))}


def raise_on_rank_one(rank: int) -> int:
    if rank == 1:
        raise ValueError("boom on rank 1")
    dist.barrier()  # waits for rank 1, which never comes
    return rank


def die_mid_collective(rank: int) -> int:
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        os._exit(1)
    time.sleep(0.5)
    dist.all_reduce(t)  # rank 1 is gone: gloo errors out, or the watchdog ends this rank
    dist.all_reduce(t)
    return rank


def page_faults_per_step(rank: int, steps: int = 18) -> list[int]:
    """Minor page faults of each of `steps` AdamW steps of a small MLP in this process."""
    import resource

    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                torch.nn.Linear(2048, 512))
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(64, 512)
    faults = []
    for _ in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return faults


def mapped_bytes_of_new_tensor(rank: int, nbytes: int = 30 << 20) -> int:
    """How many bytes of memory-mapped blocks glibc's malloc added to allocate a tensor of
    `nbytes` (0: it came from the heap). Only glibc's initial mmap threshold, 128 KiB, or
    one it adapted to after freeing a block as large, maps a 30 MiB tensor by itself."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = MallInfo2
    before = mallinfo2().hblkhd
    tensor = torch.empty(nbytes, dtype=torch.uint8)
    added = mallinfo2().hblkhd - before
    del tensor
    return added
