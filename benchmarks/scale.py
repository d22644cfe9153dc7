"""Planning time of a Llama-3-shaped model (8B, or 70B) on an 8x8 H100 mesh as layers repeat.

Prints, per layer count, the seconds each pass of `autopar.plan` takes (timed from its
progress messages) and the whole plan. With `--check`, each plan is also made the slow
way, every block traced (`capture(..., repeat_blocks=False)`) and planned on its own (no
`fold_depth`), and the two plans are compared node by node: placements, transfers,
seconds and bytes of every node, the step time and the peak memory.

Usage: python benchmarks/scale.py [--layers 2,8,32,96] [--mesh 8x8] [--time-limit 60]
       [--preset 70b] [--check]
       python benchmarks/scale.py --quick   # 2 layers on 2x2, 5 s solves, with --check
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import autopar  # noqa: E402
from autopar.passes.capturing.capture import capture  # noqa: E402
from autopar.planning import entry, graph  # noqa: E402
from autopar.planning.graph import STAGE  # noqa: E402
from examples import llama  # noqa: E402

PRESETS = {
    "8b": dict(vocab=128256, seq=4096, hidden=4096, heads=32, kv_heads=8, ffn=14336, batch=8),
    "70b": dict(vocab=128256, seq=4096, hidden=8192, heads=64, kv_heads=8, ffn=28672, batch=8),
}
# `--quick`: the fewest layers on a small mesh, both ways, to check that the script runs.
QUICK = {"layers": "2", "mesh": "2x2", "time_limit": 5.0, "check": True}
PASSES = ("capture", "annotate", "fold_depth", "find_strategies", "build_problem", "solve",
          "extract_plan")


def plan_timed(layers: int, mesh: autopar.Mesh, time_limit: float, shape: dict):
    """Seconds per pass (summed over the rounds that repeat one), and the plan."""
    model, inputs = llama.build(layers=layers, device="meta", **shape)
    marks: list[tuple[str, float]] = []

    def record(message: str) -> None:
        if message.startswith(STAGE):
            marks.append((message.split()[1], time.perf_counter()))

    plan = autopar.plan(model, mesh, inputs, time_limit=time_limit, progress=record)
    marks.append(("end", time.perf_counter()))
    seconds: dict[str, float] = {}
    for (name, start), (_, end) in zip(marks, marks[1:]):  # passes may repeat: summed
        seconds[name] = seconds.get(name, 0.0) + end - start
    return seconds, plan


@contextmanager
def every_block_planned():
    """Plan as if blocks had nothing in common: each traced, each its own decisions."""
    saved = entry.capture, graph.fold_depth
    entry.capture = functools.partial(capture, repeat_blocks=False)
    graph.fold_depth = lambda gm, keep=frozenset(): gm
    try:
        yield
    finally:
        entry.capture, graph.fold_depth = saved


def node_view(node) -> tuple:
    """What a plan decides and charges for one node (seconds to 1e-15, bytes to 1e-3)."""
    return (node.name, node.op, node.inputs, node.output, node.recompute, node.gathered,
            node.stage,
            tuple(dataclasses.astuple(t)[:5] + (round(t.seconds, 15), t.calls)
                  for t in node.transfers),
            round(node.compute_s, 15), round(node.comm_s, 15), round(node.memory_bytes, 3))


def same_plan(fast: autopar.Plan, slow: autopar.Plan) -> str:
    """"same" when the plans agree node by node and in step time and peak; else what
    differs first."""
    if len(fast.nodes) != len(slow.nodes):
        return f"{len(fast.nodes)} nodes against {len(slow.nodes)}"
    for a, b in zip(fast.nodes, slow.nodes):
        if node_view(a) != node_view(b):
            return f"node {a.name} differs"
    if abs(fast.step_time_s - slow.step_time_s) > 1e-12 * slow.step_time_s:
        return f"step {fast.step_time_s} against {slow.step_time_s}"
    if abs(fast.peak_memory_bytes - slow.peak_memory_bytes) > 1e-9 * slow.peak_memory_bytes:
        return "peak memory differs"
    return "same"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", default="2,8,32,96")
    parser.add_argument("--mesh", default="8x8")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="8b",
                        help="Llama-3 shape (80 layers for 70b)")
    parser.add_argument("--check", action="store_true",
                        help="compare each plan with the one planned block by block")
    parser.add_argument("--quick", action="store_true",
                        help=f"--layers {QUICK['layers']} --mesh {QUICK['mesh']} --time-limit "
                             f"{QUICK['time_limit']:g} --check, in place of those options")
    args = parser.parse_args()
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    shape = tuple(int(s) for s in args.mesh.split("x"))
    mesh = autopar.Mesh(shape, ("dp", "tp")[: len(shape)], hardware="h100-sxm")
    shape = PRESETS[args.preset]
    print(f"Llama-3-{args.preset.upper()} shape (batch {shape['batch']}) on {mesh.describe()}: "
          "seconds per pass")
    print(f"{'layers':>6} {'decisions':>9} " + " ".join(f"{p[:9]:>9}" for p in PASSES)
          + f" {'total':>7} {'step ms':>9} solver"
          + ("  full-trace plan (its seconds)" if args.check else ""))
    for layers in (int(n) for n in args.layers.split(",")):
        seconds, plan = plan_timed(layers, mesh, args.time_limit, shape)
        check = ""
        if args.check:
            with every_block_planned():
                slow_seconds, slow = plan_timed(layers, mesh, args.time_limit, shape)
            check = f"  {same_plan(plan, slow)} ({sum(slow_seconds.values()):.1f} s)"
        print(f"{layers:>6} {plan.solver.decisions:>9} "
              + " ".join(f"{seconds.get(p, 0.0):>9.2f}" for p in PASSES)
              + f" {sum(seconds.values()):>7.2f} {plan.step_time_s * 1e3:>9.1f} "
              + f"{plan.solver.status}{check}", flush=True)


if __name__ == "__main__":
    main()
