"""Predicted against measured memory per device, for every example on a 2x2 mesh.

For each example of `examples/` at its small default config and each budget (fractions of
the peak of the plan that keeps the model whole on one device: lower forces sharding,
ZeRO-2 and recomputation), four gloo ranks (`autopar.launch`) compile the
model, train one AdamW step and measure (`autopar.runtime.memory_probe`): the parameter
pieces, gradients and optimizer states held after the step, and the storages autograd
holds at the end of the forward. The table sets them against the plan's prediction at
the end of the forward (`autopar.tools.predicted_memory.predicted_memory`), per rank
(rank 0; a row is marked when the ranks differ), as bytes and measured / predicted.

Rows: `parameters` (stored pieces), `gradients` (the .grad tensors' own bytes), `grad
storages` (the storages they live in: a gradient that is a view of a larger buffer holds
all of it), `optimizer` (parameter-shaped states), `scalars`
(AdamW's step counters, not modelled), `gathered` (parameter copies made by collectives
and saved: ZeRO-2), `activations` (everything else saved; predicted: the kept outputs of
ops plus `copies`, the collectives' outputs that consumers keep, also shown alone),
`step peak` (the plan's peak over the step's timeline against the most a rank held during a
step, `autopar.measure`).

Usage: python benchmarks/memory_fidelity.py [--examples mlp,gpt] [--budgets 1,0.5,0.3]
       python benchmarks/memory_fidelity.py --quick   # mlp at budgets 1 and 0.5
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

from memory_workers import MemoryCase, measure_cases  # noqa: E402

import autopar  # noqa: E402
from autopar.runtime.launch import launch  # noqa: E402

EXAMPLES = ("mlp", "gpt", "llama", "bert", "moe", "resnet")
# `--quick`: the smallest example, replicated and sharded, to check that the script runs.
QUICK_EXAMPLES, QUICK_BUDGETS = "mlp", "1,0.5"


def replicated_peak(example: str) -> float:
    case = MemoryCase(f"examples.{example}")
    model, inputs = case.model()
    return autopar.plan(model, autopar.Mesh((1,), ("x",), hardware="cpu"), inputs,
                        time_limit=2.0).peak_memory_bytes


def _row(name: str, predicted: float, measured: list[int] | None) -> str:
    if measured is None:
        return f"  {name:18s} {predicted:12.0f} {'':>12s} {'':>7s}"
    ratio = f"{measured[0] / predicted:7.3f}" if predicted else (
        "    -  " if not measured[0] else "    inf")
    mark = "" if len(set(measured)) == 1 else f"  ranks differ: {measured}"
    return f"  {name:18s} {predicted:12.0f} {measured[0]:12d} {ratio}{mark}"


def table(case: MemoryCase, fraction: float, results: list) -> str:
    first = results[0]
    p = first.predicted
    plan = autopar.Plan.from_dict(first.plan)
    recomputed = sum(n.recompute for n in plan.nodes)
    gathered = sum(bool(n.gathered) for n in plan.nodes)
    split = sum(n.role == "parameter" and "S(" in n.output for n in plan.nodes)
    lines = [f"{case.example.removeprefix('examples.')} at {fraction:g} x replicated peak "
             f"({case.memory_budget:.0f} B): {split} parameters split, {gathered} kept "
             f"gathered, {recomputed} ops recomputed; plan peak "
             f"{plan.peak_memory_bytes:.0f} B",
             f"  {'kind':18s} {'predicted':>12s} {'measured':>12s} {'ratio':>7s}"]

    def each(read):
        return [read(r) for r in results]

    lines += [
        _row("parameters", p.parameters, each(lambda r: r.state.parameters)),
        _row("gradients", p.gradients, each(lambda r: r.state.gradients)),
        _row("grad storages", p.gradients, each(lambda r: r.state.gradient_storages)),
        _row("optimizer", p.optimizer_states, each(lambda r: r.state.optimizer_states)),
        _row("scalars", 0.0, each(lambda r: r.state.optimizer_scalars)),
        _row("buffers", p.buffers, each(lambda r: r.state.buffers)),
        _row("gathered", p.gathered, each(lambda r: r.saved.gathered)),
        _row("activations", p.activations + p.copies, each(lambda r: r.saved.activations)),
        _row("  of which copies", p.copies, None),
        _row("saved inputs", p.inputs, each(lambda r: r.saved.inputs)),
        _row("step peak", plan.peak_memory_bytes, each(lambda r: r.peak_bytes)),
    ]
    return "\n".join(lines)


@click.command()
@click.option("--examples", default=",".join(EXAMPLES), help="comma-separated example names")
@click.option("--budgets", default="1,0.5,0.3",
              help="fractions of the replicated plan's peak memory")
@click.option("--quick", is_flag=True,
              help=f"--examples {QUICK_EXAMPLES} --budgets {QUICK_BUDGETS}, in place of the "
                   "options above")
def main(examples: str, budgets: str, quick: bool) -> None:
    if quick:
        examples, budgets = QUICK_EXAMPLES, QUICK_BUDGETS
    fractions = [float(b) for b in budgets.split(",")]
    names = [e for e in examples.split(",") if e]
    cases, labels = [], []
    for name in names:
        peak = replicated_peak(name)
        for fraction in fractions:
            cases.append(MemoryCase(f"examples.{name}", memory_budget=fraction * peak))
            labels.append(fraction)
    start = time.perf_counter()
    results = launch(measure_cases, 4, tuple(cases), (2, 2), ("dp", "tp"), timeout=1800.0)
    print(f"mesh 2x2 (dp, tp), 4 gloo ranks, AdamW; {len(cases)} cases in "
          f"{time.perf_counter() - start:.0f} s; bytes per rank\n")
    for index, (case, fraction) in enumerate(zip(cases, labels)):
        print(table(case, fraction, [per_rank[index] for per_rank in results]))
        print()


if __name__ == "__main__":
    main()
