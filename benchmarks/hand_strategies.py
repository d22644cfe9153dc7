"""What the solver buys over the standard hand-written strategies, under the same cost model.

For every case of the golden set (`tests/golden/golden_cases.py`: each example model at a
mid-size config built on the meta device, on meshes 8 and 2x4, hardware profiles h100-sxm
and a100-sxm), plans the model and costs the hand strategies (`autopar.planning.hand_strategies`:
data parallel, ZeRO-3, Megatron over all devices, data x tensor parallel), then prints one
table: the solver's predicted step time, each hand strategy's (`*` marks one over the memory
budget, `-` one that doesn't apply), the best hand strategy that fits, and solver / best. A
hand strategy is the cheapest plan within its restriction, so a fitting one is a plan the
solver could have chosen: the script exits with status 1 when the solver is worse than the
best fitting one by more than `TOLERANCE` (relative) in any case.

Usage: python benchmarks/hand_strategies.py [--examples gpt,llama] [--time-limit 60]
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
from autopar.planning.hand_strategies import (
    plan_compared,  # noqa: E402
    standard_hand_strategies,  # noqa: E402
)
from autopar.values.plan import SINGLE_DEVICE  # noqa: E402

TOLERANCE = 1e-9
# Column headings of the standard hand strategies.
SHORT = {"data parallel": "DP", "fully sharded (ZeRO-3)": "ZeRO-3",
         "Megatron tensor parallel": "Megatron", "data x tensor parallel": "DP x TP"}


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
def main(names: str, time_limit: float) -> None:
    """Solver vs hand strategies on every example, mesh and hardware profile."""
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
