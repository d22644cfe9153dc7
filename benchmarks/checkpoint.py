"""Checkpoint size and the time a save blocks training, measured side by side.

The GPT example, planned on 4 gloo CPU processes ((dp, tp) = 2x2 under a memory budget
that shards its state, and plain data parallel, every piece replicated 4 times), trains a
few AdamW steps, then saves: synchronously, and asynchronously (`async_save=True`, the
training resuming when `save` returns). The table prints the bytes on disk against the
model's and optimizer's bytes (parameters, buffers, AdamW's two moments and step count:
what one copy of the state holds, so a ratio near 1 means no replica written twice), the
seconds a synchronous save takes, the seconds an asynchronous one blocks the loop, and the
seconds until it is committed. Times are each rank's slowest of `--repeats` saves.

Usage: python benchmarks/checkpoint.py [--hidden 512] [--layers 8] [--repeats 3]
       python benchmarks/checkpoint.py --quick   # a 1-layer GPT of width 32, 1 save per layout
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import autopar  # noqa: E402
from autopar.runtime.launch import launch  # noqa: E402
from autopar.tools import checkpoint  # noqa: E402
from examples import gpt  # noqa: E402

LAYOUTS = {"2x2 sharded": ((2, 2), ("dp", "tp"), 0.5), "data parallel": ((4,), ("dp",), None)}
# `--quick`: the smallest GPT, saved once per layout, to check that the script runs.
QUICK = {"hidden": 32, "layers": 1, "batch": 4, "seq": 16, "vocab": 256}


def _plan(config: dict, shape, axes, budget, time_limit: float) -> dict:
    model, inputs = gpt.build(**config)
    mesh = autopar.Mesh(shape, axes, hardware="cpu")
    plan = autopar.plan(model, mesh, inputs, time_limit=time_limit, pipeline=False)
    if budget is not None:
        plan = autopar.plan(model, mesh, inputs, time_limit=time_limit, pipeline=False,
                            memory_budget=budget * plan.peak_memory_bytes)
    return plan.to_dict()


def _measure_all(rank: int, config: dict, layouts: list[tuple], repeats: int) -> list[dict]:
    """Every layout (shape, axis names, plan, folder) in turn, in one start of the ranks."""
    return [_measure(config, shape, axes, plan, root, repeats)
            for shape, axes, plan, root in layouts]


def _measure(config: dict, shape, axes, plan: dict, root: str, repeats: int) -> dict:
    import torch

    torch.manual_seed(0)
    model, inputs = gpt.build(**config)
    pm = autopar.compile(model, autopar.Mesh(shape, axes, hardware="cpu"), inputs,
                         plan=autopar.Plan.from_dict(plan))
    optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-4)

    def step() -> None:
        pm(*inputs).backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    checkpoint.save(f"{root}/warm", pm, optimizer)  # first calls set up DCP's threads
    checkpoint.save(f"{root}/warm-async", pm, optimizer, async_save=True).wait()
    sync, blocked, committed = [], [], []
    for k in range(repeats):
        torch.distributed.barrier()
        start = time.perf_counter()
        checkpoint.save(f"{root}/sync{k}", pm, optimizer, step=k)
        sync.append(time.perf_counter() - start)
        torch.distributed.barrier()
        start = time.perf_counter()
        pending = checkpoint.save(f"{root}/async{k}", pm, optimizer, step=k, async_save=True)
        blocked.append(time.perf_counter() - start)
        step()  # training goes on while the pieces are written
        pending.wait()
        committed.append(time.perf_counter() - start)
    return {"sync": max(sync), "blocked": max(blocked), "committed": max(committed)}


def _state_bytes(config: dict) -> int:
    """One copy of the parameters, buffers and AdamW's state (two moments and a step)."""
    model, _ = gpt.build(**config)
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    weights = sum(t.numel() * t.element_size() for t in tensors.values())
    moments = sum(2 * p.numel() * p.element_size() for p in model.parameters())
    return weights + moments + 4 * len(list(model.parameters()))


@click.command()
@click.option("--hidden", default=512, show_default=True)
@click.option("--layers", default=8, show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--quick", is_flag=True,
              help=f"GPT {QUICK}, 1 save, 1 solver second per plan, in place of the options above")
def main(hidden: int, layers: int, repeats: int, quick: bool) -> None:
    config = {"hidden": hidden, "layers": layers, "batch": 8, "seq": 128, "vocab": 4096}
    time_limit = 5.0  # solver seconds per plan
    if quick:
        config, repeats, time_limit = dict(QUICK), 1, 1.0
    expected = _state_bytes(config)
    print(f"GPT {config}, AdamW, on 4 gloo processes; slowest rank of {repeats} saves")
    print(f"{'layout':14s} {'state MiB':>10s} {'on disk MiB':>12s} {'disk/state':>11s} "
          f"{'sync s':>8s} {'async blocks s':>15s} {'async commit s':>15s} "
          f"{'blocked/sync':>13s}")
    with tempfile.TemporaryDirectory() as folder:
        layouts = [(shape, axes, _plan(config, shape, axes, budget, time_limit),
                    f"{folder}/{index}")
                   for index, (shape, axes, budget) in enumerate(LAYOUTS.values())]
        # One start of the ranks serves every layout (starting them costs seconds).
        measured = launch(_measure_all, 4, config, layouts, repeats, timeout=1800.0)
        sizes = [sum(f.stat().st_size for f in Path(root, "sync0").rglob("*") if f.is_file())
                 for *_, root in layouts]
    for index, (name, on_disk) in enumerate(zip(LAYOUTS, sizes)):
        times = [per_rank[index] for per_rank in measured]
        slowest = {key: max(t[key] for t in times) for key in times[0]}
        print(f"{name:14s} {expected / 2**20:10.2f} {on_disk / 2**20:12.2f} "
              f"{on_disk / expected:11.3f} {slowest['sync']:8.3f} {slowest['blocked']:15.3f} "
              f"{slowest['committed']:15.3f} {slowest['blocked'] / slowest['sync']:13.3f}")


if __name__ == "__main__":
    main()
