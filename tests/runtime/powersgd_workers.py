"""Rank bodies of test_powersgd: SGD steps of an MLP whose plan all-reduces its weights'
gradients as PowerSGD, beside DistributedDataParallel with torch's PowerSGD hook on the
same ranks, the same data pieces and the same hook settings."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    powerSGD_hook,
)
from torch.nn.parallel import DistributedDataParallel

import autopar
from autopar.runtime.powersgd import POWERSGD_BUCKET_BYTES
from autopar.values.compression import POWERSGD_MIN_RATE, POWERSGD_WARMUP
from examples import mlp

SIZES = {"batch": 8, "hidden": 512, "ffn": 2048}
STEPS = POWERSGD_WARMUP + 3  # exact steps, then PowerSGD's
LR = 0.5


def build():
    return mlp.build(**SIZES)


def _ddp(model: torch.nn.Module, rank: int, group=None) -> DistributedDataParallel:
    """`model` under DDP over `group` (None: every rank) with the hook as autopar
    configures it: buckets of autopar's size (one here), which DDP also gives its first
    bucket when given a cap."""
    ddp = DistributedDataParallel(model, process_group=group,
                                  bucket_cap_mb=POWERSGD_BUCKET_BYTES / (1 << 20))
    ddp.register_comm_hook(PowerSGDState(
        group, matrix_approximation_rank=rank, start_powerSGD_iter=POWERSGD_WARMUP,
        min_compression_rate=POWERSGD_MIN_RATE, use_error_feedback=True, warm_start=True),
        powerSGD_hook)
    return ddp


def _compiled(plan: dict):
    """The MLP compiled under `plan` (a `Plan.to_dict()`), a copy of it as built, its
    inputs, and the plan's PowerSGD rank."""
    torch.manual_seed(0)
    model, inputs = build()
    reference = copy.deepcopy(model)
    planned = autopar.Plan.from_dict(plan)
    low_rank = next(int(n.compression.split("-")[1]) for n in planned.nodes
                    if n.compression.startswith("powersgd"))
    return autopar.compile(model, planned.mesh, inputs, plan=planned), reference, inputs, \
        low_rank


def train(rank: int, plan: dict) -> dict:
    """`STEPS` SGD steps under `plan` (a `Plan.to_dict()`), under DDP with PowerSGD of the
    plan's rank, and under DDP without: the runs' losses, the first two's final full
    parameters, the bytes the last step moved and the plan's."""
    pm, reference, (x, target), low_rank = _compiled(plan)
    exact = DistributedDataParallel(copy.deepcopy(reference))
    ddp = _ddp(reference, low_rank)
    here = (x.chunk(dist.get_world_size())[rank], target.chunk(dist.get_world_size())[rank])
    runs = {"autopar": (pm, (x, target)), "ddp": (ddp, here), "exact": (exact, here)}
    losses: dict[str, list[float]] = {name: [] for name in runs}
    for name, (module, inputs) in runs.items():
        optimizer = torch.optim.SGD(module.parameters(), lr=LR)
        for step in range(STEPS):
            if name == "autopar" and step == STEPS - 1:
                pm.counter.reset()
            optimizer.zero_grad()
            loss = module(*inputs)
            loss.backward()
            optimizer.step()
            losses[name].append(float(loss))
    return {"losses": losses, "params": pm.full_state_dict(),
            "reference": {k: v.detach().clone() for k, v in reference.named_parameters()},
            "measured": dict(pm.counter.totals()), "predicted": pm.plan.comm_bytes()}


def _steps(pm, optimizer, inputs, count: int) -> None:
    for _ in range(count):
        optimizer.zero_grad()
        pm(*inputs).backward()
        optimizer.step()


def resumed(rank: int, plan: dict, directory: str) -> dict:
    """`STEPS` SGD steps under `plan` straight, and again stopped after `POWERSGD_WARMUP`
    + 1 (PowerSGD has run once) and saved, then loaded into a new compiled model and
    optimizer that take the rest of the steps, with and without the saved PowerSGD state:
    the three runs' final full parameters, and those saved."""
    planned = autopar.Plan.from_dict(plan)
    stop = POWERSGD_WARMUP + 1
    finals = {}
    for run in ("straight", "resumed", "fresh"):
        torch.manual_seed(0)
        model, inputs = build()
        pm = autopar.compile(model, planned.mesh, inputs, plan=planned)
        optimizer = torch.optim.SGD(pm.parameters(), lr=LR)
        if run == "straight":
            _steps(pm, optimizer, inputs, STEPS)
        else:
            if run == "resumed":
                _steps(pm, optimizer, inputs, stop)
                autopar.checkpoint.save(directory, pm, optimizer, step=stop)
                finals["saved"] = pm.full_state_dict()
                model, _ = build()
                pm = autopar.compile(model, planned.mesh, inputs, plan=planned)
                optimizer = torch.optim.SGD(pm.parameters(), lr=LR)
            autopar.checkpoint.load(directory, pm, optimizer)
            if run == "fresh":  # the same weights, PowerSGD's state dropped
                pm.low_rank.reset()
            _steps(pm, optimizer, inputs, STEPS - stop)
        finals[run] = pm.full_state_dict()
    return finals


def hierarchical(rank: int, plan: dict) -> dict:
    """`STEPS` SGD steps under `plan`, on a (node, gpu) mesh of 2 x 2 whose weights'
    gradients are summed exactly over "gpu" and by PowerSGD over "node", and under DDP with
    the hook over the two ranks of this rank's "node" group, each fed its node's half of
    the batch (what the gpu all-reduce sums): both runs' final full parameters."""
    pm, reference, (x, target), low_rank = _compiled(plan)
    node, gpu = divmod(rank, 2)
    groups = [dist.new_group([g, 2 + g]) for g in range(2)]  # every rank makes every group
    ddp = _ddp(reference, low_rank, groups[gpu])
    here = (x.chunk(2)[node], target.chunk(2)[node])
    for module, inputs in ((pm, (x, target)), (ddp, here)):
        _steps(module, torch.optim.SGD(module.parameters(), lr=LR), inputs, STEPS)
    return {"params": pm.full_state_dict(),
            "reference": {k: v.detach().clone() for k, v in reference.named_parameters()},
            "measured": dict(pm.counter.totals()), "predicted": pm.plan.comm_bytes()}
