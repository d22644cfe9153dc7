"""Train an example model with autopar on a mesh of CPU processes (gloo), two ways:

    torchrun --nproc_per_node 2 examples/train.py --example gpt --mesh 2 --steps 5
    python examples/train.py --nproc 2 --example gpt --mesh 2 --steps 5   # autopar.launch

(The default GPT is so small that the planner keeps it whole on each rank; e.g.
`--set batch=8 --set hidden=128` makes splitting it pay.)

Every rank builds the example (`examples/<name>.py`, `build(**--set)`) from the same seed,
compiles it for the mesh (rank 0 plans, the others receive its plan) and runs `--steps` AdamW
steps on the example batch. Rank 0 prints the loss of each step (it falls as the model fits
the one batch), then the bytes its collectives moved next to what the plan predicted:
`pm.plan.comm_bytes()` per step times the steps. They agree except for regathered
(ZeRO-3) parameters whose gathered copy no op saved for the backward (see
`autopar.runtime.regather`): those are not gathered again, so measured is lower.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

# Run as a file (`python examples/train.py`, torchrun) the folder on sys.path is examples/,
# not the repository root that holds the `examples` package.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import autopar  # noqa: E402

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Run:
    """Everything a rank needs; picklable, so `autopar.launch` can send it."""

    example: str
    config: tuple[tuple[str, object], ...]
    mesh: tuple[int, ...]
    axis_names: tuple[str, ...]
    hardware: str
    steps: int
    lr: float
    seed: int
    time_limit: float
    memory_budget: float | None


def build(run: Run):
    module = importlib.import_module(f"examples.{run.example}")
    # One seed on every rank: compile expects the same initial weights everywhere.
    return module.build(seed=run.seed, **dict(run.config))


def fit(pm: autopar.ParallelModule, inputs: tuple, run: Run, rank: int) -> list[float]:
    """`run.steps` AdamW steps on `inputs`; rank 0 prints each loss."""
    optimizer = torch.optim.AdamW(pm.parameters(), lr=run.lr)
    losses = []
    for step in range(1, run.steps + 1):
        loss = pm(*inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        if rank == 0:
            print(f"step {step:>3}  loss {losses[-1]:.6f}", flush=True)
    return losses


def communication_report(pm: autopar.ParallelModule, steps: int) -> str:
    """Measured bytes per collective next to the plan's prediction for `steps` steps."""
    measured = pm.counter.totals()
    predicted = {key: value * steps for key, value in pm.plan.comm_bytes().items()}
    lines = [f"communication over {steps} steps, bytes per rank (cost model convention)",
             f"{'collective':<16}{'axis':<8}{'direction':<11}{'measured':>14}"
             f"{'predicted':>14}  match"]
    for key in sorted(set(measured) | set(predicted)):
        kind, axis, direction = key
        got, want = measured.get(key, 0), predicted.get(key, 0)
        lines.append(f"{kind:<16}{axis:<8}{direction:<11}{got:>14,}{int(want):>14,}  "
                     + ("yes" if got == want else "no"))
    if len(lines) == 2:
        lines.append("(none: the plan needs no collective)")
    return "\n".join(lines)


def train(rank: int, run: Run) -> list[float]:
    """One rank's whole run: build, compile, fit, report. Returns the losses."""
    model, inputs = build(run)
    mesh = autopar.Mesh(run.mesh, run.axis_names, hardware=run.hardware)
    pm = autopar.compile(model, mesh, inputs, time_limit=run.time_limit, seed=run.seed,
                         memory_budget=run.memory_budget)
    if rank == 0:
        print(f"{run.example} on mesh {mesh.describe()}: modelled step "
              f"{pm.plan.step_time_s * 1e3:.3f} ms", flush=True)
    losses = fit(pm, inputs, run, rank)
    if rank == 0:
        print(communication_report(pm, run.steps), flush=True)
    return losses


def _config(pairs: list[str]) -> tuple[tuple[str, object], ...]:
    config = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE")
        config.append((key, int(value) if value.lstrip("-").isdigit() else value))
    return tuple(config)


def parse(argv: list[str] | None = None) -> tuple[Run, int | None]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--example", default="gpt", help="module of examples/ (gpt, mlp, ..)")
    parser.add_argument("--mesh", default="2", help="mesh shape, e.g. 2 or 2x2")
    parser.add_argument("--axis-names", default=None, help="comma-separated (default dp,tp)")
    parser.add_argument("--hardware", default="cpu", help="hardware profile to plan for")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=10.0, help="solver seconds")
    parser.add_argument("--memory-budget", type=float, default=None,
                        help="bytes per device (default the hardware's memory)")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        metavar="KEY=VALUE", help="argument of the example's build()")
    parser.add_argument("--nproc", type=int, default=None,
                        help="processes to launch without torchrun (default: the mesh size)")
    args = parser.parse_args(argv)
    shape = tuple(int(size) for size in args.mesh.lower().split("x"))
    names = tuple(args.axis_names.split(",")) if args.axis_names else \
        ("dp", "tp", "cp")[:len(shape)]
    run = Run(args.example, _config(args.settings), shape, names, args.hardware, args.steps,
              args.lr, args.seed, args.time_limit, args.memory_budget)
    return run, args.nproc


def main(argv: list[str] | None = None) -> None:
    run, nproc = parse(argv)
    if all(variable in os.environ for variable in TORCHRUN_VARIABLES):
        if nproc is not None:
            raise SystemExit("--nproc is for runs without torchrun; torchrun sets the ranks")
        rank = autopar.runtime.init_from_env()
        try:
            train(rank, run)
        finally:
            dist.destroy_process_group()
        return
    size = 1
    for axis in run.mesh:
        size *= axis
    nproc = size if nproc is None else nproc
    if nproc == 1 and size == 1:
        train(0, run)  # a mesh of one device needs no process group
    else:
        autopar.launch(train, nproc, run, timeout=3600.0)


if __name__ == "__main__":
    main()
