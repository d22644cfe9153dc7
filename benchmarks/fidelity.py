"""Predicted against measured: step time and peak memory of plans, on this machine's processes.

For each mesh shape the cases use, the mesh is first profiled (`autopar.tools.profile`, what
`autopar profile` runs) on this machine, just before its cases. Each case plans a model
on that measured profile under one strategy (the solver's plan, a standard hand strategy by
`strategy=`, micro-batches with recomputation, a 1F1B pipeline), compiles it on gloo
processes (`autopar.launch`) and measures it (`autopar.measure`: the median of `--steps`
timed training steps after warm-up, AdamW included; each rank's peak memory over a step from
the allocator events of the profiler). The table sets the plan's step time and peak
memory per device against the measured ones (the slowest rank's median; the largest
rank's peak), and then, per model, ranks its strategies by prediction and by measurement:
every pair whose measured times differ by more than `ORDER_MARGIN` should be ordered the
same way by the prediction.

Usage: python benchmarks/fidelity.py [--steps 10] [--cases gpt,llama] [--profiles DIR]
       python benchmarks/fidelity.py --device cuda  # one GPU: its profile, 3 cases
       python benchmarks/fidelity.py --quick        # one tiny case, a quick profile
`--profiles DIR` keeps the measured profiles there and reuses those already measured.
"""

from __future__ import annotations

import importlib
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

import autopar  # noqa: E402
from autopar.runtime.launch import launch  # noqa: E402
from autopar.tools.profile import Settings, profile, write_profile  # noqa: E402

ORDER_MARGIN = 0.15
NAMES = {1: ("dp",), 2: ("dp", "tp")}
GPT = {"batch": 8, "seq": 128, "hidden": 128, "heads": 4, "layers": 2, "vocab": 512}


@dataclass(frozen=True)
class Case:
    """One model (an example module's `build(**config)`, or "hf:<name>" of
    tests/runtime/hf_models.py) on one mesh under one strategy (`options` of
    `autopar.plan`)."""

    model: str
    mesh: tuple[int, ...]
    strategy: str
    config: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    names: tuple[str, ...] | None = None

    @property
    def axis_names(self) -> tuple[str, ...]:
        return self.names or NAMES[len(self.mesh)]

    def build(self, device: str = "cpu"):
        if self.model.startswith("hf:"):
            hf_models = importlib.import_module("hf_models")
            model, inputs = hf_models.build(self.model[3:], **self.config)
            return model.to(device), tuple(t.to(device) for t in inputs)
        module = importlib.import_module(f"examples.{self.model}")
        return module.build(device=device, **self.config)


def _by_hand(name: str) -> dict:
    return {"strategy": name}


CASES = (
    Case("mlp", (2,), "solver", {"batch": 512, "hidden": 256, "ffn": 1024}),
    Case("mlp", (2,), "data parallel", {"batch": 512, "hidden": 256, "ffn": 1024},
         _by_hand("data parallel")),
    Case("gpt", (2,), "solver", GPT),
    Case("gpt", (2,), "data parallel", GPT, _by_hand("data parallel")),
    Case("gpt", (2,), "ZeRO-3", GPT, _by_hand("fully sharded (ZeRO-3)")),
    Case("gpt", (2,), "Megatron TP", GPT, _by_hand("Megatron tensor parallel")),
    Case("gpt", (2,), "4 micro-batches, recompute", GPT,
         {"strategy": "FSDP + full recompute", "microbatches": 4}),
    Case("gpt", (2,), "1F1B pipeline", GPT,
         {"pipeline": autopar.Pipeline(axis="pp", schedule="1F1B", microbatches=4)},
         names=("pp",)),
    Case("gpt", (2, 2), "solver", GPT),
    Case("gpt", (2, 2), "data x tensor", GPT, _by_hand("data x tensor parallel")),
    Case("llama", (4,), "solver", {"batch": 8, "seq": 128}),
    Case("llama", (4,), "data parallel", {"batch": 8, "seq": 128}, _by_hand("data parallel")),
    Case("bert", (2, 2), "solver", {"batch": 8, "seq": 128}),
    Case("moe", (2,), "solver", {"batch": 8, "seq": 128}),
    Case("resnet", (2,), "solver", {"batch": 32, "size": 32}),
    Case("resnet", (2,), "data parallel", {"batch": 32, "size": 32}, _by_hand("data parallel")),
    Case("hf:gpt2", (2,), "solver", {"batch": 8, "seq": 64}),
    Case("hf:mixtral", (2, 2), "solver", {"batch": 8, "seq": 64}),
)
QUICK_CASES = (Case("mlp", (2,), "solver", {"batch": 64}),)
CUDA_CASES = (
    Case("gpt", (1,), "solver", {"batch": 16, "seq": 512, "hidden": 512, "heads": 8,
                                 "layers": 4, "vocab": 8192}),
    Case("llama", (1,), "solver", {"batch": 8, "seq": 512}),
    Case("resnet", (1,), "solver", {"batch": 64, "size": 64}),
)


@dataclass(frozen=True)
class Result:
    case: Case
    predicted_s: float
    measured_s: float
    spread: float
    predicted_bytes: float
    measured_bytes: float

    @property
    def time_ratio(self) -> float:
        return self.predicted_s / self.measured_s

    @property
    def memory_ratio(self) -> float:
        return self.predicted_bytes / self.measured_bytes


def measured_profile(shape: tuple[int, ...], names: tuple[str, ...], folder: Path,
                     settings: Settings, device: str) -> str:
    """The path of a profile of this mesh measured on this machine: from `folder` when it
    holds one, else measured now and kept there."""
    label = "x".join(map(str, shape)) + "-" + ",".join(names) + f"-{device}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{label}.json"
    if not path.exists():
        start = time.perf_counter()
        write_profile(profile(shape, names, settings=settings, device=device), path)
        print(f"profiled mesh {label} in {time.perf_counter() - start:.0f} s -> {path}",
              flush=True)
    return str(path)


def _run_rank(rank: int, case: Case, plan_data: dict, steps: int, device: str):
    model, inputs = case.build(device)
    plan = autopar.Plan.from_dict(plan_data)
    pm = autopar.compile(model, plan.mesh, inputs, plan=plan)
    return autopar.measure(pm, inputs, steps=steps)


def run_case(case: Case, hardware: str, steps: int, device: str) -> Result:
    # Planned on the model the ranks build (a meta model may capture other views).
    model, inputs = case.build()
    mesh = autopar.Mesh(case.mesh, case.axis_names, hardware=hardware)
    plan = autopar.plan(model, mesh, inputs, time_limit=10, **case.options)
    if math.prod(case.mesh) == 1:
        ranks = [_run_rank(0, case, plan.to_dict(), steps, device)]
    else:
        ranks = launch(_run_rank, math.prod(case.mesh), case, plan.to_dict(), steps, device,
                       timeout=900)
    slowest = max(ranks, key=lambda m: m.median_s)
    return Result(case, plan.step_time_s, slowest.median_s, slowest.spread,
                  plan.peak_memory_bytes, max(m.peak_memory_bytes for m in ranks))


def _row(result: Result) -> str:
    case = result.case
    mesh = "x".join(map(str, case.mesh))
    return (f"| {case.model} | {mesh} | {case.strategy} | {result.predicted_s * 1e3:.2f} | "
            f"{result.measured_s * 1e3:.2f} (±{result.spread:.0%}) | {result.time_ratio:.2f} | "
            f"{result.predicted_bytes / 2**20:.1f} | {result.measured_bytes / 2**20:.1f} | "
            f"{result.memory_ratio:.2f} |")


def orderings(results: list[Result]) -> list[str]:
    """Per model and mesh, the strategies ranked by prediction and by measurement, and the
    pairs whose measured times differ by more than `ORDER_MARGIN` that the prediction
    orders the other way."""
    lines = []
    groups: dict[tuple, list[Result]] = {}
    for r in results:
        groups.setdefault((r.case.model, r.case.mesh), []).append(r)
    for (model, _), group in groups.items():
        if len(group) < 2:
            continue
        label = [f"{r.case.strategy} ({'x'.join(map(str, r.case.mesh))})" for r in group]
        by_prediction = sorted(range(len(group)), key=lambda k: group[k].predicted_s)
        by_measurement = sorted(range(len(group)), key=lambda k: group[k].measured_s)
        lines.append(f"{model}: predicted  " + " < ".join(label[k] for k in by_prediction))
        lines.append(f"{' ' * len(model)}  measured   " + " < ".join(label[k]
                                                                    for k in by_measurement))
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                if abs(a.measured_s / b.measured_s - 1) > ORDER_MARGIN and \
                        (a.measured_s < b.measured_s) != (a.predicted_s < b.predicted_s):
                    lines.append(f"  MISORDERED: {a.case.strategy} vs {b.case.strategy}")
    return lines


def report(results: list[Result]) -> str:
    lines = ["| model | mesh | strategy | predicted ms | measured ms | pred/meas | "
             "predicted MiB | measured MiB | pred/meas |", "|---" * 9 + "|"]
    lines += [_row(r) for r in results]
    times = [abs(r.time_ratio - 1) for r in results]
    memory = [abs(r.memory_ratio - 1) for r in results]
    lines.append(f"\nstep time: median |pred/meas - 1| {statistics.median(times):.1%}, worst "
                 f"{max(times):.1%}; peak memory: median {statistics.median(memory):.1%}, "
                 f"worst {max(memory):.1%} over {len(results)} cases")
    return "\n".join(lines + orderings(results))


@click.command()
@click.option("--steps", default=10, show_default=True, help="timed steps per case")
@click.option("--cases", "only", default=None, help="comma-separated models to run")
@click.option("--profiles", type=click.Path(path_type=Path), default=None,
              help="folder to keep (and reuse) the measured profiles in")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu")
@click.option("--quick", is_flag=True, help="one tiny case with a quick profile")
def main(steps: int, only: str | None, profiles: Path | None, device: str, quick: bool) -> None:
    cases = QUICK_CASES if quick else CUDA_CASES if device == "cuda" else CASES
    if only:
        cases = tuple(c for c in cases if c.model in only.split(","))
    settings = Settings.quick() if quick else Settings()
    profiles = profiles or Path(tempfile.mkdtemp(prefix="autopar-fidelity-"))
    results = []
    for case in cases:
        hardware = measured_profile(case.mesh, case.axis_names, profiles, settings, device)
        start = time.perf_counter()
        results.append(run_case(case, hardware, 2 if quick else steps, device))
        print(_row(results[-1]) + f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    print()
    print(report(results))


if __name__ == "__main__":
    main()
