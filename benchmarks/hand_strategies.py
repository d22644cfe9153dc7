"""What the solver buys over the standard hand-written strategies, under the same cost model.

For every case of the golden set (`tests/golden/golden_cases.py`: each example model at a
mid-size config built on the meta device, on meshes 8 and 2x4, hardware profiles h100-sxm
and a100-sxm), plans the model and costs the hand strategies
(`autopar.planning.hand_strategies.standard_hand_strategies`: data parallel, ZeRO-3, Megatron
over all devices, data x tensor parallel, FSDP with full recomputation, Megatron with
selective recomputation and a distributed optimizer, context x tensor parallel with FSDP),
then prints one table: the solver's predicted step time, each hand strategy's (`*` marks
one over the memory budget, `-` one that doesn't apply), the best hand strategy that fits,
and solver / best. A hand strategy is the cheapest plan within its restriction, so a fitting
one is a plan the solver could have chosen: the script exits with status 1 when the solver
is worse than the best fitting one by more than `TOLERANCE` (relative) in any case.

Usage: python benchmarks/hand_strategies.py [--examples gpt,llama] [--time-limit 60]
       python benchmarks/hand_strategies.py --quick   # the mlp example's four cases, 5 s solves
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "golden"))

from golden_cases import CASES, TIME_LIMIT, GoldenCase  # noqa: E402

import autopar  # noqa: E402
from autopar.passes.capturing.annotate import annotate  # noqa: E402
from autopar.passes.capturing.capture import capture  # noqa: E402
from autopar.planning.hand_strategies import (  # noqa: E402
    plan_compared,
    standard_hand_strategies,
)
from autopar.values.plan import SINGLE_DEVICE  # noqa: E402

TOLERANCE = 1e-9
# Column headings of the standard hand strategies.
SHORT = {"data parallel": "DP", "fully sharded (ZeRO-3)": "ZeRO-3",
         "Megatron tensor parallel": "Megatron", "data x tensor parallel": "DP x TP",
         "FSDP + full recompute": "FSDP + recompute",
         "Megatron TP + selective recompute + distributed optimizer": "Megatron + SR + DO",
         "CP x TP x FSDP": "CP x TP x FSDP"}
# `--quick`: the smallest example's cases with short solves, to check that the script runs.
QUICK_EXAMPLES, QUICK_TIME_LIMIT = "mlp", 5.0


def _graph(case: GoldenCase):
    model, inputs = case.build()
    return annotate(capture(model, tuple(inputs)))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f}"


@click.command()
@click.option("--examples", "names", default=",".join(dict.fromkeys(c.example for c in CASES)),
              show_default=True, help="comma-separated example modules")
@click.option("--time-limit", type=float, default=TIME_LIMIT, show_default=True,
              help="solver seconds per solve")
@click.option("--quick", is_flag=True,
              help=f"--examples {QUICK_EXAMPLES} --time-limit {QUICK_TIME_LIMIT:g}, in place "
                   "of the options above")
def main(names: str, time_limit: float, quick: bool) -> None:
    """Solver vs hand strategies on every example, mesh and hardware profile."""
    if quick:
        names, time_limit = QUICK_EXAMPLES, QUICK_TIME_LIMIT
    console = Console(width=160)
    wanted = names.split(",")
    columns = [s.name for s in standard_hand_strategies(autopar.Mesh((2, 4), ("dp", "tp")))]
    table = Table(title="Predicted step time (ms): solver vs hand strategies "
                        "(* over memory, - not applicable)", title_justify="left")
    for name in ("example", "mesh", "hardware", "solver", *(SHORT.get(c, c) for c in columns),
                 "best fitting", "solver / best", "plan s"):
        table.add_column(name, justify="left" if name in ("example", "mesh", "hardware",
                                                          "best fitting") else "right")
    worse = []
    graphs = {}
    for case in CASES:
        if case.example not in wanted:
            continue
        name, shape, hardware = case.example, case.mesh, case.hardware
        if name not in graphs:  # one capture per example serves its four cases
            graphs[name] = _graph(case)
        gm = graphs[name]
        mesh = case.mesh_value()
        start = time.perf_counter()
        plan = plan_compared(gm, mesh, model_name=name, time_limit=time_limit,
                             hand_strategies=True)
        seconds = time.perf_counter() - start
        records = {r.name: r for r in plan.hand_strategies if r.name != SINGLE_DEVICE}
        cells = []
        for column in columns:
            r = records[column]
            cells.append("-" if r.step_time_s is None else
                         _ms(r.step_time_s) + ("" if r.fits else "*"))
        fitting = [r for r in records.values() if r.step_time_s is not None and r.fits]
        best = min(fitting, key=lambda r: r.step_time_s, default=None)
        ratio = plan.step_time_s / best.step_time_s if best else None
        if ratio is not None and ratio > 1 + TOLERANCE:
            worse.append(f"{name} {shape} {hardware}: solver {_ms(plan.step_time_s)} "
                         f"ms > {best.name} {_ms(best.step_time_s)} ms")
        table.add_row(name, "x".join(map(str, shape)), hardware, _ms(plan.step_time_s),
                      *cells, SHORT.get(best.name, best.name) if best else "none fits",
                      "-" if ratio is None else f"{ratio:.6f}", f"{seconds:.1f}")
        console.print(f"{name} {shape} {hardware}: {seconds:.1f} s", highlight=False)
    console.print(table)
    for line in worse:
        console.print(f"solver worse than a fitting hand strategy: {line}")
    sys.exit(1 if worse else 0)


if __name__ == "__main__":
    main()
