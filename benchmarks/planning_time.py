"""Planning time at default options: transformers' Llama classes at the sizes and batches
users train, planned by `autopar.plan(model, mesh, inputs)` with nothing else set (the
h100-sxm profile), and, with `--against 10`, planned again with ten times the time limit
to show what the default's budget gives up.

    python benchmarks/planning_time.py                     # the four cases, defaults
    python benchmarks/planning_time.py --case 8b --against 10
    python benchmarks/planning_time.py --time-limit 10     # another limit for every case
    python benchmarks/planning_time.py --quick             # a tiny Llama: 10 s

Prints, per case, the seconds the call took (capture included) against its limit, the
predicted step, MFU and peak memory, micro-batches and pipeline, and the solver's gap;
with `--against`, the longer plan's step and the ratio of the two steps.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

from large_models import Case, build  # noqa: E402

import autopar  # noqa: E402


@dataclass(frozen=True)
class Planned:
    """A case to plan: the Llama shape, the model's dtype, the mesh and its axes."""

    shape: Case
    dtype: torch.dtype
    mesh: tuple[int, ...]
    axes: tuple[str, ...]


CASES = {
    "8b": Planned(Case("Llama-3-8B shape", 32, 4096, 32, 8, 14336, 128256, 64, 4096),
                  torch.float32, (8, 8), ("dp", "tp")),
    "70b-8": Planned(Case("Llama-3-70B shape", 80, 8192, 64, 8, 28672, 128256, 8, 4096),
                     torch.bfloat16, (8, 8), ("dp", "tp")),
    "70b-64": Planned(Case("Llama-3-70B shape", 80, 8192, 64, 8, 28672, 128256, 64, 4096),
                      torch.bfloat16, (8, 8), ("dp", "tp")),
    "405b": Planned(Case("Llama-3-405B shape", 126, 16384, 128, 8, 53248, 128256, 1024,
                         4096), torch.bfloat16, (8, 8, 8), ("pp", "dp", "tp")),
}
# `--quick`: a 2-layer Llama of width 256 on 2x2, with a 5 s limit and against twice it.
QUICK = Planned(Case("tiny Llama shape", 2, 256, 4, 2, 512, 1024, 8, 256), torch.float32,
                (2, 2), ("dp", "tp"))


def planned(case: Planned, time_limit: float | None) -> tuple[autopar.Plan, float]:
    """The plan of `case` at default options (or with `time_limit`), and its seconds."""
    model, inputs = build(case.shape)
    model = model.to(case.dtype)
    mesh = autopar.Mesh(case.mesh, case.axes, hardware="h100-sxm")
    options = {} if time_limit is None else {"time_limit": time_limit}
    planner = autopar.plan  # imports the planning modules: once per process, not planning
    start = time.monotonic()
    plan = planner(model, mesh, inputs, **options)
    return plan, time.monotonic() - start


def row(name: str, plan: autopar.Plan, seconds: float) -> str:
    layout = (f"pipeline {plan.pipeline.schedule} x {plan.pipeline.microbatches}"
              if plan.pipeline is not None else f"{plan.microbatches} micro-batch(es)")
    mfu = f"{plan.mfu:.3f}" if plan.mfu is not None else "-"
    return (f"| {name} | {seconds:.1f} of {plan.solver.time_limit_s:g} | "
            f"{plan.step_time_s:.4f} | {mfu} | {plan.peak_memory_bytes / 2**30:.1f} | "
            f"{layout} | {plan.solver.gap:.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    parser.add_argument("--time-limit", type=float, help="instead of the default")
    parser.add_argument("--against", type=float, help="also plan with this many times the "
                        "limit, and compare the steps")
    parser.add_argument("--quick", action="store_true", help="a tiny Llama, 5 s against 10")
    args = parser.parse_args()
    cases = {name: CASES[name] for name in args.case or list(CASES)}
    if args.quick:
        cases, args.time_limit, args.against = {"tiny": QUICK}, 5.0, 2.0
    print("| case | planned in (s) | step (s) | MFU | GiB | layout | gap |")
    print("|---|---|---|---|---|---|---|")
    for name, case in cases.items():
        plan, seconds = planned(case, args.time_limit)
        print(row(name, plan, seconds), flush=True)
        if args.against:
            longer, taken = planned(case, args.against * plan.solver.time_limit_s)
            print(row(f"{name} x{args.against:g}", longer, taken)
                  + f" step ratio {plan.step_time_s / longer.step_time_s:.3f}", flush=True)


if __name__ == "__main__":
    main()
