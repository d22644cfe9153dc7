"""Planning time of a Llama-3-shaped model (8B, or 70B) on an 8x8 H100 mesh as layers repeat.

Prints, per layer count, the seconds each pass of `autopar.plan` takes (timed from its
progress messages) and the whole plan.
Usage: python benchmarks/scale.py [--layers 2,8,32,96] [--mesh 8x8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import autopar  # noqa: E402
from autopar.graph_planning import STAGE  # noqa: E402
from examples import llama  # noqa: E402

PRESETS = {
    "8b": dict(vocab=128256, seq=4096, hidden=4096, heads=32, kv_heads=8, ffn=14336, batch=8),
    "70b": dict(vocab=128256, seq=4096, hidden=8192, heads=64, kv_heads=8, ffn=28672, batch=8),
}
PASSES = ("capture", "annotate", "find_strategies", "build_problem", "solve", "extract_plan")


def plan_timed(layers: int, mesh: autopar.Mesh, time_limit: float, shape: dict):
    """Seconds per pass, and the plan."""
    model, inputs = llama.build(layers=layers, device="meta", **shape)
    marks: list[tuple[str, float]] = []

    def record(message: str) -> None:
        if message.startswith(STAGE):
            marks.append((message.split()[1], time.perf_counter()))

    plan = autopar.plan(model, mesh, inputs, time_limit=time_limit, progress=record)
    marks.append(("end", time.perf_counter()))
    seconds = {name: end - start for (name, start), (_, end) in zip(marks, marks[1:])}
    return seconds, plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", default="2,8,32,96")
    parser.add_argument("--mesh", default="8x8")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="8b",
                        help="Llama-3 shape (80 layers for 70b)")
    args = parser.parse_args()
    shape = tuple(int(s) for s in args.mesh.split("x"))
    mesh = autopar.Mesh(shape, ("dp", "tp")[: len(shape)], hardware="h100-sxm")
    shape = PRESETS[args.preset]
    print(f"Llama-3-{args.preset.upper()} shape (batch {shape['batch']}) on {mesh.describe()}: "
          "seconds per pass")
    print(f"{'layers':>6} {'decisions':>9} " + " ".join(f"{p[:9]:>9}" for p in PASSES)
          + f" {'total':>7} {'step ms':>9} solver")
    for layers in (int(n) for n in args.layers.split(",")):
        seconds, plan = plan_timed(layers, mesh, args.time_limit, shape)
        print(f"{layers:>6} {plan.solver.decisions:>9} "
              + " ".join(f"{seconds[p]:>9.2f}" for p in PASSES)
              + f" {sum(seconds.values()):>7.2f} {plan.step_time_s * 1e3:>9.1f} "
              + f"{plan.solver.status}", flush=True)


if __name__ == "__main__":
    main()
