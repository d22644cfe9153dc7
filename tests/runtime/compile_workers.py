"""Rank bodies for the compile tests (module level, so spawned processes can import them)."""

from __future__ import annotations

import copy
import os

import torch

import autopar
from autopar.runtime.grad_reduce import reducible
from examples import mlp

MEGATRON = {"fc1.weight": "S(0)", "fc2.weight": "S(1)"}


def compile_for_wrong_world(rank: int) -> str:
    """Compile for a mesh of 4 devices in a world of 2: the error message."""
    model, inputs = mlp.build()
    try:
        autopar.compile(model, autopar.Mesh((4,), ("x",), hardware="cpu"), inputs)
    except autopar.AutoparError as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def die_mid_training(rank: int) -> None:
    """Two Megatron steps; rank 1 dies before the second, while rank 0 waits in its
    forward all-reduce."""
    torch.manual_seed(0)
    model, inputs = mlp.build()
    pm = autopar.compile(model, autopar.Mesh((2,), ("tp",), hardware="cpu"), inputs,
                         constraints=MEGATRON)
    pm(*inputs).backward()
    if rank == 1:
        os._exit(3)
    pm(*inputs).backward()


def infeasible_on_rank_zero(rank: int) -> str:
    """Rank 0's planning error reaches every rank, none hangs."""
    model, inputs = mlp.build()
    try:
        autopar.compile(model, autopar.Mesh((2,), ("x",), hardware="cpu"), inputs,
                        memory_budget=1000.0)
    except autopar.InfeasiblePlanError as error:
        return f"{type(error).__name__} min_bytes={error.min_bytes:.0f}"
    return "no error"


DATA_PARALLEL = {"fc1.weight": "R", "fc1.bias": "R", "fc2.weight": "R", "fc2.bias": "R",
                 "linear": "S(0)", "linear_1": "S(0)"}


def _data_parallel_mlp(**sizes):
    """A data-parallel MLP on 2 ranks, the plain model it was built from, and the inputs."""
    torch.manual_seed(0)
    model, inputs = mlp.build(**sizes)
    reference = copy.deepcopy(model)
    pm = autopar.compile(model, autopar.Mesh((2,), ("dp",), hardware="cpu"), inputs,
                         constraints=DATA_PARALLEL)
    return pm, reference, inputs


def _error_against_twice(pm, reference, inputs) -> float:
    """Largest relative difference between `pm`'s gradients and twice those of one backward
    pass of `reference`."""
    reference(*inputs).backward()
    grads = pm.full_grads()
    return max(float((grads[n] - 2 * p.grad).abs().max() / p.grad.abs().max())
               for n, p in reference.named_parameters())


def accumulate_two_backwards(rank: int) -> float:
    """Largest relative difference between the gradients of two backward passes without
    zero_grad (data parallel, so every gradient all-reduce overlaps the backward) and twice
    the plain model's gradients."""
    pm, reference, inputs = _data_parallel_mlp()
    assert all(reducible(r) for name, r in pm.collectives if name.startswith("p_"))
    for _ in range(2):
        pm(*inputs).backward()
    return _error_against_twice(pm, reference, inputs)


def large_gradients_accumulated(rank: int) -> tuple[float, list[int]]:
    """Data parallel on an MLP whose weight gradients (1 MiB each) fill a gradient bucket
    alone, so that they are all-reduced in place: the largest relative difference between
    the gradients of two backward passes without zero_grad and twice the plain model's, and
    the sizes of the gradient all-reduces of the second pass."""
    from autopar.runtime import grad_reduce

    pm, reference, inputs = _data_parallel_mlp(hidden=256, ffn=1024)
    pm(*inputs).backward()
    sizes: list[int] = []
    all_reduce = grad_reduce.dist.all_reduce

    def recording(tensor, *args, **kwargs):
        sizes.append(tensor.numel())
        return all_reduce(tensor, *args, **kwargs)

    grad_reduce.dist.all_reduce = recording
    try:
        pm(*inputs).backward()
    finally:
        grad_reduce.dist.all_reduce = all_reduce
    return _error_against_twice(pm, reference, inputs), sorted(sizes)


def _kept_gathered_case(rank: int, mesh, dim: int) -> dict:
    from torch import nn

    from autopar.runtime import CommCounter, Redistribution, redistribute
    from autopar.runtime.grad_reduce import GradientReducer, gather_kept, scatterable
    from autopar.values.placement import Replicate, Shard

    edge = Redistribution.for_edge((8, 6), torch.float32, (Shard(dim),), (Replicate(),),
                                   (Shard(0),), (2,))
    assert scatterable(edge), edge
    full = torch.randn((8, 6), generator=torch.Generator().manual_seed(0))
    shard = full.chunk(2, dim)[rank]
    # Different data per rank: each holds one summand of the gradient.
    x = torch.randn((8, 6), generator=torch.Generator().manual_seed(1 + rank))
    synced, overlapped = nn.Parameter(shard.clone()), nn.Parameter(shard.clone())
    sync_counter, async_counter, reducer = CommCounter(), CommCounter(), GradientReducer()
    seen = []

    def look(grad):
        seen.append((len(reducer._scatters), overlapped.grad is None))

    for _ in range(2):
        (redistribute(synced, edge, mesh, sync_counter) * x).square().sum().backward()
        # `earlier` is made first, so autograd reaches it after the gathered copy.
        earlier = torch.ones((), requires_grad=True)
        late = earlier * 2
        late.register_hook(look)
        gathered = gather_kept(overlapped, edge, mesh, async_counter, reducer)
        ((gathered * x).square().sum() + late).backward()
    grad = overlapped.grad
    return {"error": float((grad - synced.grad).abs().max()),
            "scale": float(synced.grad.abs().max()),
            "owns": grad.untyped_storage().nbytes() == grad.numel() * grad.element_size(),
            "shape": tuple(grad.shape), "expected_shape": tuple(shard.shape),
            "sync": sync_counter.totals(), "async": async_counter.totals(),
            "async_calls": async_counter.calls(), "seen": seen,
            "left": len(reducer._scatters)}


def regathered_async_against_sync(rank: int) -> dict:
    """A chain of five (6, 6) layers whose weights are stored S(0) on 2 ranks, gathered at
    each use and again for the backward (ZeRO-3, in a `Regather` scope), through the
    synchronous edge and through the background one (`Collective(kept_gathered=True)`).
    Reports the largest gradient difference, both counters, and the most reduce-scatters a
    hook on each layer's output gradient saw in flight."""
    from torch import nn

    from autopar.runtime import Redistribution, device_mesh
    from autopar.runtime.collectives import Collective, RankContext
    from autopar.values.placement import Replicate, Shard

    mesh = device_mesh(autopar.Mesh((2,), ("dp",), hardware="cpu"))
    edge = Redistribution.for_edge((6, 6), torch.float32, (Shard(0),), (Replicate(),),
                                   (Shard(0),), (2,), regather=True)
    weights = [torch.randn((6, 6), generator=torch.Generator().manual_seed(i)).chunk(2)[rank]
               for i in range(5)]
    x = torch.randn((4, 6), generator=torch.Generator().manual_seed(10 + rank))
    seen, grads, totals = [], [], []
    for kept in (False, True):
        context = RankContext(mesh)
        edges = [Collective(edge, context, kept_gathered=kept) for _ in weights]
        params = [nn.Parameter(w.clone()) for w in weights]
        with context.regather:
            h = x
            for collective, param in zip(edges, params):
                h = torch.tanh(h @ collective(param))
                if kept:
                    h.register_hook(lambda g, r=context.reducer: seen.append(len(r._scatters)))
        h.square().sum().backward()
        grads.append([p.grad for p in params])
        totals.append(context.counter.totals())
    return {"error": max(float((a - b).abs().max()) for a, b in zip(*grads)),
            "sync": totals[0], "async": totals[1], "most_in_flight": max(seen),
            "seen": len(seen)}


def kept_gathered_async_against_sync(rank: int) -> list[dict]:
    """Per gathered dim (0 and 1) of an (8, 6) parameter stored S(d) on 2 ranks and kept
    gathered for a data-parallel use: two backward passes without zero_grad through
    `gather_kept` and through the synchronous `redistribute`, from equal shards. Reports the
    largest gradient difference, whether the async `.grad` owns its storage, both counters,
    and what a hook on a later part of the backward saw: the reduce-scatter in flight and
    `.grad` not yet set."""
    from autopar.runtime import device_mesh

    mesh = device_mesh(autopar.Mesh((2,), ("dp",), hardware="cpu"))
    return [_kept_gathered_case(rank, mesh, dim) for dim in (0, 1)]
