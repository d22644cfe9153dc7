"""Runtime overhead of autopar's compiled programs against the torch code they replace.

Comparisons of one training step (forward, backward, AdamW step) of the example MLP
(`examples/mlp.py`, ffn = 4 x hidden), each pair measured side by side in the same process:

1. `autopar.compile` on a mesh of one device vs the plain model, one process.
   Target <= 1.02x: a one-device program is the captured graph and nothing else.
2. A data-parallel plan (parameters replicated, the linears split by batch) vs torch
   `DistributedDataParallel`, 2 gloo ranks. Target <= 1.05x. A second row compares it with
   DDP that also sums the loss over the ranks, as autopar's program does (see below).
3. A Megatron plan (fc1 split by columns, fc2 by rows, one forward all-reduce) vs torch's
   tensor parallelism (`parallelize_module` with `ColwiseParallel`/`RowwiseParallel`),
   2 gloo ranks. Target <= 1.05x.

Every process keeps the memory it frees (`autopar.runtime.keep_freed_memory`, which
`autopar.runtime.launch` applies to its ranks). With glibc's defaults a step page-faulted
its tensors back in, thousands of pages on most steps but not all, so that which contender
paid more changed from block to block: the data-parallel ratio moved between 1.00 and 1.22
over runs of the same code.

Both contenders start from the same weights and see the same global batch (DDP ranks get
their half of it). Timed blocks of `--steps` steps alternate A, B, B, A, ... so that drifts
in machine load hit both alike; a block's ms/step is its wall time over its steps (ranks
meet at a barrier before and after each block). The ms columns are medians over `--repeats`
blocks (three times as many for the one-device row: its target, 2%, is tighter than one
block's noise, and its steps are the cheapest); ratio (autopar / baseline, below 1 autopar
is faster) is the median of the ratios of the two blocks of each repeat, which cancels
load from other processes better; its quartiles show the noise. On a shared machine ratios
move by a few percent from run to run: compare with the target only a ratio that repeats.
The losses of both contenders must agree, on the first step and after the same number of
steps, or the script fails: both trained the same model.

Reading the data-parallel row: autopar's program starts the parameter gradients'
all-reduces where the backward produces them, packed into buckets, and lets them run while
the backward goes on (`autopar.runtime.grad_reduce`), as DDP does. It also sums the loss (a
scalar) over the ranks so that every rank returns the global loss, which DDP does not; the
plan divides the loss before summing it, so that sum is the program's last collective and
completes in the background (`autopar.runtime.pending`): ranks do not wait for each other at
the end of the forward. That one collective more per step is not free on a CPU process
group: it wakes gloo's threads, which take a core from the compute of two busy ranks. The
"DDP + loss sum" row gives DDP the same output (the global loss on every rank, summed by an
asynchronous all-reduce started at the end of its forward) and so measures the runtime's
overhead alone. In the Megatron row, torch's parameters are DTensors: its forward,
backward and optimizer step pay DTensor's dispatch on every op, where autopar's program runs
on plain local tensors.

Usage: python benchmarks/overhead.py [--steps 3] [--repeats 31] [--hidden 512] [--batch 128]
       python benchmarks/overhead.py --quick   # 1 step, 1 repeat, hidden 32, batch 8: a smoke
                                               # run of every row, its ratios only noise
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click
import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import autopar  # noqa: E402
from autopar.runtime import keep_freed_memory  # noqa: E402
from autopar.runtime.launch import launch  # noqa: E402
from examples import mlp  # noqa: E402

RANKS = 2
LEARNING_RATE = 1e-4
# Losses of two fp32 programs that sum in a different order (split matmuls, all-reduces)
# differ by rounding; after AdamW steps the difference grows a little (see
# tests/runtime/equivalence_cases.py), far below any real mismatch.
LOSS_RTOL = 1e-4
SOLVER_SECONDS = 5.0
# The one-device row times this many times `--repeats` blocks (see the module docstring).
SINGLE_DEVICE_REPEATS = 3
# Pins that force the plans compared, whatever the sizes. `linear` and `linear_1` are the
# captured graph's names of fc1's and fc2's outputs, `broadcast_tensors` the loss's first op
# (see `pm.code`), `div` its last (the division by the global count, pinned before the sum
# over the ranks: see the module docstring). Megatron's fc2 output is a partial sum made
# whole by one all-reduce (at large batches the solver would rather reduce-scatter it and
# split the loss by batch).
DATA_PARALLEL = {"fc1.weight": "R", "fc1.bias": "R", "fc2.weight": "R", "fc2.bias": "R",
                 "linear": "S(0)", "linear_1": "S(0)", "div": "P"}
MEGATRON = {"fc1.weight": "S(0)", "fc1.bias": "S(0)", "fc2.weight": "S(1)", "fc2.bias": "R",
            "linear_1": "P", "broadcast_tensors": "R"}


@dataclass(frozen=True)
class Config:
    steps: int
    repeats: int
    hidden: int
    batch: int


# `--quick`: every row on the smallest sizes, to check that the script runs.
QUICK = Config(steps=1, repeats=1, hidden=32, batch=8)


@dataclass(frozen=True)
class Row:
    """One comparison's result; times in ms per step (medians)."""

    comparison: str
    autopar_ms: float
    baseline_ms: float
    ratio: float
    spread: tuple[float, float]  # quartiles of the per-repeat ratios: the noise
    target: float
    loss_rel_diff: float


@dataclass(frozen=True)
class Contender:
    """A training step to time, and how to read its loss as the global batch's loss."""

    step: Callable[[], torch.Tensor]
    global_loss: Callable[[torch.Tensor], float] = float


def training_step(module: nn.Module, inputs: tuple, *,
                  sum_loss: bool = False) -> Callable[[], torch.Tensor]:
    """One AdamW step of `module` on `inputs`; returns the detached loss. With `sum_loss` (a
    DDP module), the step returns the global batch's mean loss on every rank, as autopar's
    program does: the rank-local losses are summed by an all-reduce started right after the
    forward, in the background of the backward and the optimizer step."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE)

    def step() -> torch.Tensor:
        optimizer.zero_grad()
        loss = module(*inputs)
        if sum_loss:
            total = loss.detach().clone()
            work = dist.all_reduce(total, async_op=True)
        loss.backward()
        optimizer.step()
        if not sum_loss:
            return loss.detach()
        work.wait()
        return total / dist.get_world_size()

    return step


def build(config: Config):
    # The same seed everywhere: every rank and every contender starts from these weights.
    return mlp.build(batch=config.batch, hidden=config.hidden, ffn=4 * config.hidden)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def compare(name: str, ours: Contender, theirs: Contender, config: Config,
            target: float) -> Row:
    """Time both contenders in alternating blocks; check their losses agree."""
    first = [c.global_loss(c.step()) for c in (ours, theirs)]
    for _ in range(2):  # warm-up: allocator, thread pools, DTensor's sharding caches
        for contender in (ours, theirs):
            contender.step()
    times: dict[int, list[float]] = {0: [], 1: []}
    last: dict[int, torch.Tensor] = {}
    for repeat in range(config.repeats):
        # A, B then B, A: a drift within a repeat does not favour whoever goes first.
        order = (0, 1) if repeat % 2 == 0 else (1, 0)
        for index in order:
            contender = (ours, theirs)[index]
            _barrier()
            start = time.perf_counter()
            for _ in range(config.steps):
                last[index] = contender.step()
            _barrier()
            times[index].append((time.perf_counter() - start) / config.steps * 1e3)
    final = [c.global_loss(last[i]) for i, c in enumerate((ours, theirs))]
    differences = (_relative(*first), _relative(*final))
    assert max(differences) <= LOSS_RTOL, (
        f"{name}: losses differ (first step {first}, last step {final}): the contenders do "
        "not compute the same model")
    # The ratio of the two blocks of a repeat, taken back to back, cancels the load that
    # other processes put on the machine better than a ratio of overall medians.
    ratios = [a / b for a, b in zip(times[0], times[1])]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return Row(name, statistics.median(times[0]), statistics.median(times[1]),
               statistics.median(ratios), (quartiles[0], quartiles[2]), target,
               max(differences))


def single_device(config: Config) -> Row:
    """autopar on a mesh of one device vs the eager model, in this process."""
    model, inputs = build(config)
    eager = copy.deepcopy(model)
    mesh = autopar.Mesh((1,), ("x",), hardware="cpu")
    pm = autopar.compile(model, mesh, inputs, time_limit=SOLVER_SECONDS)
    assert not pm.plan.comm_bytes(), "a one-device program moves no bytes"
    more = dataclasses.replace(config, repeats=SINGLE_DEVICE_REPEATS * config.repeats)
    return compare("1 device vs eager", Contender(training_step(pm, inputs)),
                   Contender(training_step(eager, inputs)), more, target=1.02)


def _mean_over_ranks(loss: torch.Tensor) -> float:
    # DDP ranks hold the mean loss of their half; the global batch's loss is their mean.
    total = loss.clone()
    dist.all_reduce(total)
    return float(total) / dist.get_world_size()


def _compile_pinned(model: nn.Module, inputs: tuple, constraints: dict[str, str]):
    mesh = autopar.Mesh((RANKS,), ("x",), hardware="cpu")
    return autopar.compile(model, mesh, inputs, constraints=constraints,
                           time_limit=SOLVER_SECONDS)


def _check_data_parallel(pm: autopar.ParallelModule) -> None:
    placements = {n.name: n.output for n in pm.plan.nodes if n.role == "parameter"}
    assert set(placements.values()) == {"R"}, f"parameters not replicated: {placements}"
    moves = {(kind, direction) for kind, _, direction in pm.plan.comm_bytes()}
    # Besides the gradients' all-reduces, the loss (a scalar) is summed over the ranks.
    assert moves <= {("all_reduce", "backward"), ("all_reduce", "forward")}, moves
    forward = pm.plan.comm_bytes().get(("all_reduce", "x", "forward"), 0)
    assert forward <= 8, f"forward all-reduces {forward} bytes, more than the loss"


def data_parallel(rank: int, config: Config) -> list[Row]:
    """A pinned data-parallel plan vs DistributedDataParallel on the same global batch,
    without and with the sum of the loss over the ranks."""
    model, inputs = build(config)
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(model))
    pm = _compile_pinned(model, inputs, DATA_PARALLEL)
    _check_data_parallel(pm)
    # DDP averages the ranks' gradients, so each rank's mean loss over its half of the
    # batch gives the gradient of the mean loss over the whole batch: no scaling needed.
    halves = tuple(t.chunk(RANKS)[rank].contiguous() for t in inputs)
    # Each row starts both contenders' optimizers afresh from the same (trained) weights.
    return [compare("data parallel vs DDP", Contender(training_step(pm, inputs)),
                    Contender(training_step(ddp, halves), _mean_over_ranks), config,
                    target=1.05),
            compare("data parallel vs DDP + loss sum", Contender(training_step(pm, inputs)),
                    Contender(training_step(ddp, halves, sum_loss=True)), config, target=1.05)]


def _check_megatron(pm: autopar.ParallelModule, config: Config) -> None:
    # One all-reduce of fc2's (batch, hidden) output, forward; nothing else.
    expected = {("all_reduce", "x", "forward"): 4 * config.batch * config.hidden}
    assert pm.plan.comm_bytes() == expected, pm.plan.comm_bytes()


def megatron(rank: int, config: Config) -> Row:
    """A Megatron plan vs torch tensor parallelism (DTensor) with the same split."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model, inputs = build(config)
    device_mesh = init_device_mesh("cpu", (RANKS,))
    torch_tp = parallelize_module(copy.deepcopy(model), device_mesh,
                                  {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    pm = _compile_pinned(model, inputs, MEGATRON)
    _check_megatron(pm, config)
    return compare("Megatron vs torch TP", Contender(training_step(pm, inputs)),
                   Contender(training_step(torch_tp, inputs)), config, target=1.05)


def distributed(rank: int, config: Config) -> list[Row]:
    """Every 2-rank comparison in one launch (starting ranks costs seconds)."""
    return [*data_parallel(rank, config), megatron(rank, config)]


def print_table(rows: list[Row], config: Config) -> None:
    table = Table(title=f"autopar overhead: MLP hidden {config.hidden}, ffn "
                        f"{4 * config.hidden}, batch {config.batch}; medians of "
                        f"{config.repeats} blocks of {config.steps} steps (1 device: "
                        f"{SINGLE_DEVICE_REPEATS * config.repeats})")
    for column in ("comparison", "autopar ms/step", "baseline ms/step", "ratio",
                   "ratio quartiles", "target", "met?", "loss rel. diff"):
        first = column == "comparison"
        table.add_column(column, justify="left" if first else "right", no_wrap=first)
    for row in rows:
        table.add_row(row.comparison, f"{row.autopar_ms:.2f}", f"{row.baseline_ms:.2f}",
                      f"{row.ratio:.3f}", f"{row.spread[0]:.2f}-{row.spread[1]:.2f}",
                      f"<= {row.target:.2f}",
                      "yes" if row.ratio <= row.target else "NO", f"{row.loss_rel_diff:.1e}")
    Console(width=130).print(table)  # whole rows also when piped (rich assumes 80)


@click.command(help=__doc__)
@click.option("--steps", default=3, show_default=True, help="steps per timed block")
@click.option("--repeats", default=31, show_default=True, help="timed blocks per contender")
@click.option("--hidden", default=512, show_default=True, help="MLP width (ffn is 4x)")
@click.option("--batch", default=128, show_default=True, help="global batch (even)")
@click.option("--quick", is_flag=True,
              help=f"the smallest run, in place of the options above: {QUICK}")
def main(steps: int, repeats: int, hidden: int, batch: int, quick: bool) -> None:
    config = QUICK if quick else Config(steps, repeats, hidden, batch)
    keep_freed_memory()  # as in the ranks `launch` starts
    rows = [single_device(config)]
    # Rank 0's view: the barriers around each block make every rank's times alike.
    rows += launch(distributed, RANKS, config, timeout=3600.0)[0]
    print_table(rows, config)


if __name__ == "__main__":
    main()
