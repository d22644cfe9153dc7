"""Predicted against measured peak memory of each pipeline stage, on a (pp, tp) mesh of gloo
processes.

For each schedule and micro-batch count, the GPT example is planned as a pipeline over the
`pp` axis of a 2x2 (pp, tp) mesh (the planner chooses the stages' sharding over `tp`),
compiled on four gloo ranks (`autopar.launch`) and measured (`autopar.measure`: the most a
rank held during a step, from the profiler's allocator events, AdamW included). Per pipeline
rank, the table sets the plan's peak (`StageRecord.memory_bytes`, summed over the stages the
rank runs: two each with Interleaved1F1B) against the larger of its two ranks' measured
peaks, with the micro-batches its stages hold in flight at the peak.

Usage: python benchmarks/stage_memory.py [--schedules 1F1B,GPipe] [--microbatches 4,8]
       python benchmarks/stage_memory.py --quick   # 1F1B, 4 micro-batches, a smaller GPT
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import autopar  # noqa: E402
import examples.gpt as gpt  # noqa: E402
from autopar.runtime.launch import launch  # noqa: E402

MESH, AXES = (2, 2), ("pp", "tp")
CONFIG = {"batch": 8, "seq": 64, "hidden": 128, "heads": 4, "layers": 4, "vocab": 512}
QUICK_CONFIG = {"batch": 4, "seq": 32, "hidden": 64, "heads": 4, "layers": 2, "vocab": 256}
SCHEDULES = ("1F1B", "GPipe", "Interleaved1F1B")
MICROBATCHES = (4, 8)


@dataclass(frozen=True)
class Row:
    """One pipeline rank of one case: what its stages hold at the peak, predicted and
    measured."""

    schedule: str
    microbatches: int
    rank: int
    in_flight: tuple[int, ...]
    predicted: float
    measured: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured


def _measure_rank(rank: int, config: dict, plan_data: dict) -> tuple[tuple[int, ...], int]:
    model, inputs = gpt.build(**config)
    plan = autopar.Plan.from_dict(plan_data)
    pm = autopar.compile(model, plan.mesh, inputs, plan=plan)
    measured = autopar.measure(pm, inputs, steps=1, warmup=1)
    return measured.coordinate, measured.peak_memory_bytes


def run_case(config: dict, schedule: str, microbatches: int) -> list[Row]:
    model, inputs = gpt.build(**config)
    pipeline = autopar.Pipeline(axis="pp", schedule=schedule, microbatches=microbatches)
    plan = autopar.plan(model, autopar.Mesh(MESH, AXES, hardware="cpu"), inputs,
                        pipeline=pipeline)
    measured = launch(_measure_rank, 4, config, plan.to_dict(), timeout=900)
    rows = []
    for rank in range(MESH[0]):
        stages = [s for s in plan.pipeline.stages if s.rank == rank]
        peak = max(bytes_ for coordinate, bytes_ in measured if coordinate[0] == rank)
        rows.append(Row(schedule, microbatches, rank, tuple(s.in_flight for s in stages),
                        sum(s.memory_bytes for s in stages), peak))
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| schedule | micro-batches | pp rank | in flight | predicted MiB | measured MiB "
             "| pred/meas |", "|---|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r.schedule} | {r.microbatches} | {r.rank} | "
                     f"{'+'.join(map(str, r.in_flight))} | {r.predicted / 2**20:.2f} | "
                     f"{r.measured / 2**20:.2f} | {r.ratio:.2f} |")
    errors = [abs(r.ratio - 1) for r in rows]
    lines.append(f"\nper stage: median |pred/meas - 1| {statistics.median(errors):.1%}, "
                 f"worst {max(errors):.1%}; within 10%: "
                 f"{sum(e <= 0.10 for e in errors)} of {len(errors)}")
    return "\n".join(lines)


@click.command()
@click.option("--schedules", default=",".join(SCHEDULES), show_default=True)
@click.option("--microbatches", default=",".join(map(str, MICROBATCHES)), show_default=True)
@click.option("--quick", is_flag=True, help="1F1B with 4 micro-batches on a smaller GPT")
def main(schedules: str, microbatches: str, quick: bool) -> None:
    config = QUICK_CONFIG if quick else CONFIG
    cases = [("1F1B", 4)] if quick else [
        (s, int(m)) for s in schedules.split(",") for m in microbatches.split(",")]
    print(f"GPT {config} on a 2x2 (pp, tp) mesh of gloo processes, one AdamW step measured")
    rows = [row for schedule, count in cases for row in run_case(config, schedule, count)]
    print(table(rows))


if __name__ == "__main__":
    main()
