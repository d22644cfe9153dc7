"""The pipeline bubble, measured: step time against micro-batches on a pp=2 gloo pipeline.

For each schedule and each count of micro-batches m, the GPT example is planned as a
pipeline of two stages over two CPU processes (`autopar.Pipeline(schedule=..., microbatches=m)`,
the `cpu` hardware profile) and trained: a few warm-up steps, then the median step time of
`--steps` steps, measured side by side in one run. The table sets it against the plan's
prediction (`plan.step_time_s`: the schedule's formula over the stages' modelled times) and,
since the `cpu` profile is a datasheet guess rather than a measurement of this machine,
also compares the shapes: each time over the time at the fewest micro-batches, measured and
predicted, and the predicted bubble (1 - m max_r tau_r / T).

Usage: python benchmarks/pipeline_bubble.py [--microbatches 2,4,8]
       [--schedules GPipe,1F1B,Interleaved1F1B,InterleavedZeroBubble] [--steps 8] [--warmup 2]
       python benchmarks/pipeline_bubble.py --quick   # a 2-layer GPT of width 32, GPipe at
                                                      # m = 2 and 4, 1 step after 1
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import autopar  # noqa: E402
from autopar.runtime.launch import launch  # noqa: E402
from examples import gpt  # noqa: E402

CONFIG = {"hidden": 256, "heads": 4, "layers": 8, "batch": 16, "seq": 128, "vocab": 1024}
MESH = ((2,), ("pp",))
# `--quick`: the smallest pipeline, to check that the script runs (its times are noise).
QUICK = {"config": {"hidden": 32, "heads": 2, "layers": 2, "batch": 4, "seq": 16, "vocab": 128},
         "microbatches": "2,4", "schedules": "GPipe", "steps": 1, "warmup": 1,
         "time_limit": 1.0}


def _plan(config: dict, schedule: str, microbatches: int, time_limit: float) -> dict:
    model, inputs = gpt.build(**config)
    pipeline = autopar.Pipeline(schedule=schedule, microbatches=microbatches)
    return autopar.plan(model, autopar.Mesh(*MESH, hardware="cpu"), inputs,
                        time_limit=time_limit, pipeline=pipeline).to_dict()


def _measure(rank: int, config: dict, plans: list[dict], steps: int,
             warmup: int) -> list[float]:
    import torch

    medians = []
    for plan in plans:
        torch.manual_seed(0)
        model, inputs = gpt.build(**config)
        pm = autopar.compile(model, autopar.Mesh(*MESH, hardware="cpu"), inputs,
                             plan=autopar.Plan.from_dict(plan))
        optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-4)
        times = []
        for step in range(warmup + steps):
            torch.distributed.barrier()
            start = time.perf_counter()
            pm(*inputs).backward()
            optimizer.step()
            optimizer.zero_grad()
            if step >= warmup:
                times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    return medians


@click.command()
@click.option("--microbatches", default="2,4,8", help="comma-separated counts")
@click.option("--schedules", default="GPipe,1F1B", help="comma-separated schedule names")
@click.option("--steps", default=8, show_default=True)
@click.option("--warmup", default=2, show_default=True)
@click.option("--quick", is_flag=True,
              help="a 2-layer GPT of width 32, GPipe at m = 2 and 4, 1 step after 1 warm-up, "
                   "1 solver second per plan, in place of the options above")
def main(microbatches: str, schedules: str, steps: int, warmup: int, quick: bool) -> None:
    config, time_limit = CONFIG, 5.0  # solver seconds per plan
    if quick:
        config, microbatches, schedules, steps, warmup, time_limit = (
            QUICK["config"], QUICK["microbatches"], QUICK["schedules"], QUICK["steps"],
            QUICK["warmup"], QUICK["time_limit"])
    counts = [int(m) for m in microbatches.split(",")]
    names = schedules.split(",")
    cases = [(name, m) for name in names for m in counts]
    plans = [_plan(config, name, m, time_limit) for name, m in cases]
    measured = launch(_measure, 2, config, plans, steps, warmup, timeout=1800.0)
    slowest = [max(per_rank[i] for per_rank in measured) for i in range(len(cases))]
    print(f"GPT {config} on pp=2 gloo processes; median of {steps} steps after {warmup}")
    header = (f"{'schedule':22s} {'m':>3s} {'predicted ms':>13s} {'measured ms':>12s} "
              f"{'meas/pred':>10s} {'pred T/T0':>10s} {'meas T/T0':>10s} {'pred bubble':>12s}")
    print(header)
    for name in names:
        rows = [(m, autopar.Plan.from_dict(plan), time_s)
                for (n, m), plan, time_s in zip(cases, plans, slowest) if n == name]
        base_pred, base_meas = rows[0][1].step_time_s, rows[0][2]
        for m, plan, time_s in rows:
            predicted = plan.step_time_s
            print(f"{name:22s} {m:3d} {predicted * 1e3:13.2f} {time_s * 1e3:12.2f} "
                  f"{time_s / predicted:10.3f} {predicted / base_pred:10.3f} "
                  f"{time_s / base_meas:10.3f} {plan.pipeline.bubble:12.1%}")


if __name__ == "__main__":
    main()
