"""The golden set: every example model planned on two meshes and two hardware profiles.

`CASES` is the one list the golden test (`test_golden.py`) and the benchmark of hand
strategies (`benchmarks/hand_strategies.py`) read. Each example is built on the meta device
at a mid-size configuration (billions of FLOPs per layer, memory that matters on some meshes),
so that a plan is a real decision and not everything-replicated, while capture and solve stay
within seconds. A case's golden record (`record`) keeps what a regression would change: the
placements of every node and the predicted costs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import autopar
from autopar.values.plan import NodePlan, Plan

# Mid-size configurations, by example module (examples/<name>.py). A module that does not
# exist (yet) is left out of the set.
CONFIGS: dict[str, dict[str, object]] = {
    "mlp": {"batch": 4096, "hidden": 4096, "ffn": 16384},
    "gpt": {"vocab": 50304, "seq": 1024, "hidden": 1024, "heads": 16, "layers": 8,
            "batch": 16},
    # Llama-2-7B's shape: data parallelism's replicated fp32 weights, gradients and Adam
    # states (16 bytes a parameter, 100 GiB) exceed a device, so this one needs sharding.
    "llama": {"vocab": 32000, "seq": 1024, "hidden": 4096, "heads": 32, "kv_heads": 8,
              "ffn": 11008, "layers": 32, "batch": 8},
    "bert": {"vocab": 30522, "seq": 512, "hidden": 1024, "heads": 16, "layers": 8,
             "batch": 32},
    "moe": {"vocab": 32000, "seq": 512, "hidden": 1024, "heads": 16, "ffn": 2816,
            "experts": 8, "top": 2, "layers": 4, "batch": 16},
    "resnet": {"batch": 128, "size": 112, "classes": 1000, "widths": (64, 128, 256, 512),
               "blocks": 2, "groups": 32},
}
MESHES: tuple[tuple[tuple[int, ...], tuple[str, ...]], ...] = (
    ((8,), ("dp",)),
    ((2, 4), ("dp", "tp")),
)
HARDWARE = ("h100-sxm", "a100-sxm")
# Solver seconds: far above what these solves take (all reach a proven optimum in a few
# seconds); the search itself is bounded by deterministic time, so plans are reproducible.
TIME_LIMIT = 60.0
# Relative change of a predicted cost that counts as a regression.
COST_TOLERANCE = 1e-3


@dataclass(frozen=True)
class GoldenCase:
    example: str
    mesh: tuple[int, ...]
    axis_names: tuple[str, ...]
    hardware: str
    pipeline: autopar.Pipeline | None = None
    training: bool = True

    @property
    def name(self) -> str:
        suffix = "" if self.pipeline is None else (
            f"-pp-{self.pipeline.schedule or 'any'}-m{self.pipeline.microbatches}")
        suffix += "" if self.training else "-inference"
        return f"{self.example}-{'x'.join(map(str, self.mesh))}-{self.hardware}{suffix}"

    @property
    def config(self) -> dict[str, object]:
        return dict(CONFIGS[self.example])

    def build(self):
        """The example's model and example inputs, on the meta device; for inference, the
        inputs without the targets (the model returns its logits)."""
        module = importlib.import_module(f"examples.{self.example}")
        model, inputs = module.build(device="meta", **self.config)
        return model, inputs if self.training else inputs[:1]

    def mesh_value(self) -> autopar.Mesh:
        return autopar.Mesh(self.mesh, self.axis_names, hardware=self.hardware)


def _available(example: str) -> bool:
    try:
        importlib.import_module(f"examples.{example}")
    except ModuleNotFoundError:
        return False
    return True


CASES: tuple[GoldenCase, ...] = tuple(
    GoldenCase(example, shape, names, hardware)
    for example in CONFIGS if _available(example)
    for shape, names in MESHES for hardware in HARDWARE)


# Pipelined cases: the example over a pp axis of 2 with tensor parallelism inside the
# stages, 4 micro-batches, one schedule each (one stage per rank, and interleaved).
PIPELINED_CASES: tuple[GoldenCase, ...] = tuple(
    GoldenCase(example, (2, 4), ("pp", "tp"), "h100-sxm",
               autopar.Pipeline(schedule=schedule, microbatches=4))
    for example, schedule in (("gpt", "1F1B"), ("llama", "Interleaved1F1B"))
    if _available(example))


# Forward-only plans (training=False): the Llama example as it serves, returning logits.
INFERENCE_CASES: tuple[GoldenCase, ...] = tuple(
    GoldenCase("llama", shape, names, "h100-sxm", training=False)
    for shape, names in (((8,), ("tp",)), ((2, 4), ("dp", "tp"))) if _available("llama"))


def _placements(node: NodePlan) -> str:
    inputs = " ".join(f"[{p}]" for p in node.inputs)
    return f"{inputs} -> [{node.output}]" if inputs else f"[{node.output}]"


def record(case: GoldenCase, plan: Plan) -> dict:
    """What the golden file of `case` keeps of `plan` (JSON-ready)."""
    return {
        "case": case.name,
        "model": plan.model,
        "mesh": list(case.mesh),
        "axis_names": list(case.axis_names),
        "hardware": case.hardware,
        "config": case.config,
        "step_time_s": plan.step_time_s,
        "compute_s": plan.compute_s,
        "comm_s": plan.comm_s,
        "peak_memory_bytes": plan.peak_memory_bytes,
        "comm_bytes": {"/".join(key): value for key, value in plan.comm_bytes().items()},
        # A pipeline's stages may share names (a received tensor, a tied weight): by stage.
        "placements": {(node.name if plan.pipeline is None else f"{node.stage}:{node.name}"):
                       _placements(node) for node in plan.nodes},
        **({} if plan.pipeline is None else {"pipeline": {
            "schedule": plan.pipeline.schedule, "microbatches": plan.pipeline.microbatches,
            "stages": [list(s.blocks) for s in plan.pipeline.stages]}}),
    }


def _relative(new: float, old: float) -> float:
    return abs(new - old) / max(abs(old), 1e-30)


def differences(golden: dict, current: dict) -> list[str]:
    """Readable lines for every placement that changed and every cost that moved by more
    than `COST_TOLERANCE` (relative); empty when the plan matches its golden record."""
    lines = []
    old, new = golden["placements"], current["placements"]
    for name in old.keys() - new.keys():
        lines.append(f"node {name} is gone (was {old[name]})")
    for name in new.keys() - old.keys():
        lines.append(f"node {name} is new: {new[name]}")
    lines += [f"node {name}: {old[name]}  now  {new[name]}"
              for name in old if name in new and old[name] != new[name]]
    if golden.get("pipeline") != current.get("pipeline"):
        lines.append(f"pipeline {golden.get('pipeline')}  now  {current.get('pipeline')}")
    for key in ("step_time_s", "compute_s", "comm_s", "peak_memory_bytes"):
        if _relative(current[key], golden[key]) > COST_TOLERANCE:
            change = (current[key] - golden[key]) / max(abs(golden[key]), 1e-30)
            lines.append(f"{key}: {golden[key]:.6g}  now  {current[key]:.6g} ({change:+.2%})")
    moved, kept = golden["comm_bytes"], current["comm_bytes"]
    for key in sorted(moved.keys() | kept.keys()):
        before, after = moved.get(key, 0.0), kept.get(key, 0.0)
        if _relative(after, before) > COST_TOLERANCE:
            lines.append(f"bytes {key}: {before:.6g}  now  {after:.6g}")
    return lines
