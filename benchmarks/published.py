"""autopar's predictions against published measurements: torchtitan's Llama training runs
(pytorch/torchtitan, docs/performance.md), each planned with the hand strategy of its
configuration on the profile of the hardware it ran on.

    python benchmarks/published.py                  # every case: 23 s on 2 shared cores
    python benchmarks/published.py --case 405b-h100 --case 8b-a100
    python benchmarks/published.py --quick          # the 8B case on 8 H100s, 5 s solves: 15 s

A case builds its model's shape from transformers' `LlamaConfig` on the meta device in
bfloat16 (vocabulary 128256, sequence 8192, `benchmarks/large_models.py`'s `build`) with
the published local batch on every data-parallel rank, trained in the cost model by AdamW
with fp32 master weights and states (torchtitan keeps fp32 parameters under FSDP2's bf16
mixed precision: the same 16 bytes per parameter element) in one micro-batch, and plans it
with the hand strategy the run used (`autopar.passes.strategies.restrict`: a role per mesh
axis and a recompute mode, solved as `autopar.plan(strategy=...)` solves the standard ones,
here within the device's memory when some plan of the strategy fits): FSDP is "zero" on
the mesh axis (a flat axis over all the GPUs, as FSDP2's one process group), FSDP x TP
"zero" over the hosts and "tp" inside them, torchtitan's op-level selective activation
checkpointing autopar's "op" recompute (every second matmul of a block recomputed too)
and its full checkpointing "full" (on one axis, "FSDP + full recompute" exactly).
Profiles: `h100-grand-teton` (the H100s torchtitan ran on: 94 GB HBM2e at 2.4 TB/s, 500 W)
and `a100-sxm`.

The table: published tokens/s/GPU and memory (torchtitan's peak reserved GiB, where
published), predicted (tokens a GPU takes per step over the predicted step time; the
plan's peak memory, `*` where no plan of the strategy fits the device), their ratios,
the prediction with all communication hidden (compute and optimizer only: how much of the
gap is the overlap the cost model does not credit), and the MFU both ways by torchtitan's
formula ((6 x parameters + 12 x layers x heads x head dim x sequence) FLOPs a token over
the bf16 peak of the H100 SXM or A100 datasheet, the parameters with the input embedding
or without as that version of torchtitan counted them: it reproduces every published MFU)
at the published and at the predicted throughput, and autopar's own (`Plan.mfu`). Cases off
by more than `TOLERANCE` are listed at the end; docs/DESIGN.md ("Published measurements")
explains each.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from case_options import case_parser, parse_cases  # noqa: E402
from large_models import Case, build  # noqa: E402

import autopar  # noqa: E402
from autopar.costs.optimizer_state import optimizer_state  # noqa: E402
from autopar.errors import InfeasiblePlanError  # noqa: E402
from autopar.passes.capturing.annotate import annotate  # noqa: E402
from autopar.passes.capturing.capture import capture  # noqa: E402
from autopar.passes.strategies.restrict import restrict  # noqa: E402
from autopar.planning.graph import default_budget, plan_table, strategy_tables  # noqa: E402

TOLERANCE = 0.15  # relative: the target for every predicted throughput and memory
VOCAB, SEQ = 128256, 8192
# Dense bf16 peaks torchtitan's MFU divides by (the H100 SXM and A100 datasheets').
TORCHTITAN_PEAK = {"h100": 989e12, "a100": 312e12}
DOC = "torchtitan docs/performance.md"


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int


LLAMA_8B = Shape("Llama 3 8B", 32, 4096, 32, 8, 14336)
LLAMA_70B = Shape("Llama 3 70B", 80, 8192, 64, 8, 28672)
LLAMA_405B = Shape("Llama 3.1 405B", 126, 16384, 128, 8, 53248)


@dataclass(frozen=True)
class Published:
    """One published run: the model, the local batch (sequences of `SEQ` per data-parallel
    rank), the mesh and each axis's role, the recompute mode, the hardware profile, and
    the published figures."""

    title: str
    shape: Shape
    local_batch: int
    mesh: tuple[int, ...]
    roles: tuple[str, ...]
    recompute: str
    strategy: str  # what the table calls the hand strategy
    hardware: str
    gpu: str  # whose peak the published MFU divides by: "h100" or "a100"
    tokens_per_s: float  # per GPU
    memory_gib: float | None  # torchtitan's peak reserved memory (None: not published)
    mfu: float | None  # as published (None: not published)
    source: str
    # Whether the doc's torchtitan counted the input embedding in its MFU's parameters (it
    # stopped with the version of Table 1, whose "33% to 39%" MFU excludes it).
    mfu_embedding: bool = True

    @property
    def devices(self) -> int:
        return math.prod(self.mesh)

    @property
    def data_parallel(self) -> int:
        return math.prod(size for size, role in zip(self.mesh, self.roles) if role != "tp")

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple({"zero": "dp", "tp": "tp"}[role] for role in self.roles)


CASES = {
    "8b-h100": Published(
        "Llama 3.1 8B, FSDP, selective op AC, eager", LLAMA_8B, 2, (8,), ("zero",),
        "op", "FSDP + op-level selective recompute", "h100-grand-teton", "h100", 5762, 82.4,
        None, f"{DOC} @eaea6f6, Table 1 (8 H100)", mfu_embedding=False),
    "8b-h100-128": Published(
        "Llama 3.1 8B, FSDP, selective op AC, eager", LLAMA_8B, 2, (128,), ("zero",),
        "op", "FSDP + op-level selective recompute", "h100-grand-teton", "h100", 5605, 67.0,
        None, f"{DOC} @eaea6f6, Table 3 (128 H100)", mfu_embedding=False),
    "8b-a100": Published(
        "Llama 3 8B, FSDP, selective op AC", LLAMA_8B, 1, (64,), ("zero",), "op",
        "FSDP + op-level selective recompute", "a100-sxm", "a100", 2973, None, 0.582,
        f"{DOC} @0413364 (64 A100 80 GB)"),
    "70b-a100": Published(
        "Llama 3 70B, FSDP, full AC", LLAMA_70B, 1, (64,), ("zero",), "full",
        "FSDP + full recompute", "a100-sxm", "a100", 331, None, 0.517,
        f"{DOC} @0413364 (64 A100 80 GB; an earlier version: 323, 50.5%)"),
    "405b-h100": Published(
        "Llama 3.1 405B, FSDP 16 x TP 8, full AC, bf16", LLAMA_405B, 2, (16, 8),
        ("zero", "tp"), "full", "FSDP x TP + full recompute", "h100-grand-teton", "h100",
        109, None, 0.290, f"{DOC}, the version with Llama 3.1 405B (128 H100 94 GB)"),
}
QUICK_CASES, QUICK_TIME_LIMIT = ("8b-h100",), 5.0


def torchtitan_flops_per_token(shape: Shape, params: int, embedding: bool = True) -> float:
    """torchtitan's `get_num_flop_per_token`: 6 x parameters (less the input embedding's
    unless `embedding`) + 12 x layers x heads x head dim x sequence (attention's two
    matmuls, forward and backward, over the whole score matrix)."""
    head_dim = shape.hidden // shape.heads
    counted = params if embedding else params - VOCAB * shape.hidden
    return 6 * counted + 12 * shape.layers * shape.heads * head_dim * SEQ


def build_case(case: Published) -> tuple[torch.nn.Module, tuple]:
    """The case's model on the meta device and its inputs (the global batch)."""
    shape = case.shape
    return build(Case(shape.name, shape.layers, shape.hidden, shape.heads, shape.kv_heads,
                      shape.ffn, VOCAB, case.local_batch * case.data_parallel, SEQ))


@dataclass(frozen=True)
class Predicted:
    plan: autopar.Plan
    params: int
    tokens_per_gpu: float  # per step
    fits: bool
    least_bytes: float | None  # the least memory of the strategy, where no plan fits
    plan_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_gpu / self.plan.step_time_s

    @property
    def hidden_tokens_per_s(self) -> float:
        """Throughput with every collective hidden: compute and the optimizer's step."""
        return self.tokens_per_gpu / (self.plan.compute_s + self.plan.optimizer_s)

    @property
    def memory_gib(self) -> float:
        return self.plan.peak_memory_bytes / 2**30


def predict(case: Published, time_limit: float) -> Predicted:
    """Plan `case` with its hand strategy: the fastest plan of the strategy, or the fastest
    that fits the device's memory budget when that one does not (as the run did)."""
    model, inputs = build_case(case)
    params = sum(p.numel() for p in model.parameters())
    mesh = autopar.Mesh(case.mesh, case.axes, hardware=case.hardware)
    start = time.monotonic()
    gm = annotate(capture(model, inputs))
    tables = strategy_tables(gm, mesh, fold_layers=True, recompute=True, microbatches=1)
    table = restrict(tables.gm, tables.found, mesh, case.roles, case.recompute).table
    options = dict(model_name=case.shape.name, time_limit=time_limit, fold_layers=True,
                   seed=0, microbatches=1,
                   optimizer=optimizer_state(torch.optim.AdamW, master_weights=torch.float32))
    plan = plan_table(tables.gm, table, mesh, memory_budget=None, **options)
    budget = default_budget(mesh, None)
    fits, least = plan.peak_memory_bytes <= budget, None
    if not fits:
        try:
            plan = plan_table(tables.gm, table, mesh, memory_budget=budget, **options)
            fits = True
        except InfeasiblePlanError as error:  # its search stops at the time limit: the
            least = min(error.min_bytes or math.inf, plan.peak_memory_bytes)  # least found
    return Predicted(plan, params, case.local_batch * case.data_parallel * SEQ / case.devices,
                     fits, least, time.monotonic() - start)


def describe(name: str, case: Published, got: Predicted) -> None:
    """The case's configuration and its predicted step, in lines."""
    plan = got.plan
    print(f"## {name}: {case.title}; {case.source}")
    print(f"{got.params / 1e9:.2f} B parameters, local batch {case.local_batch} x {SEQ}, "
          f"mesh {plan.mesh.describe()}, {case.strategy} "
          f"({', '.join(case.roles)}; {case.recompute} recompute); planned in "
          f"{got.plan_s:.0f} s")
    print(f"predicted step {plan.step_time_s:.3f} s: compute {plan.compute_s:.3f}, "
          f"communication {plan.exposed_comm_s:.3f} exposed + {plan.hidden_comm_s:.3f} "
          f"hidden, optimizer {plan.optimizer_s:.3f}; published step "
          f"{got.tokens_per_gpu / case.tokens_per_s:.3f} s")
    budget = default_budget(plan.mesh, None) / 2**30
    fit = (f"within the budget of {budget:.1f} GiB" if got.fits else
           f"no plan of the strategy fits the budget of {budget:.1f} GiB (the least found: "
           f"{got.least_bytes / 2**30:.1f} GiB); the fastest plan's")
    print(f"peak memory {got.memory_gib:.1f} GiB, {fit}")


def _ratio(predicted: float, published: float | None) -> str:
    return "-" if published is None else f"{predicted / published:.3f}"


def table(rows: list[tuple[str, Published, Predicted]]) -> list[str]:
    """Print the table; return the figures off by more than `TOLERANCE`."""
    print(f"{'case':<12}{'tok/s/GPU':>10}{'pred':>7}{'ratio':>7}{'hidden':>8}{'GiB':>7}"
          f"{'pred':>7}{'ratio':>7}{'MFU':>8}{'pred':>7}{'autopar':>9}")
    off = []
    for name, case, got in rows:
        flops = torchtitan_flops_per_token(case.shape, got.params, case.mfu_embedding)
        peak = TORCHTITAN_PEAK[case.gpu]
        mfu = case.mfu if case.mfu is not None else case.tokens_per_s * flops / peak
        memory = "-" if case.memory_gib is None else f"{case.memory_gib:.1f}"
        print(f"{name:<12}{case.tokens_per_s:>10,.0f}{got.tokens_per_s:>7,.0f}"
              f"{_ratio(got.tokens_per_s, case.tokens_per_s):>7}"
              f"{got.hidden_tokens_per_s:>8,.0f}{memory:>7}"
              f"{got.memory_gib:>6.1f}{'' if got.fits else '*':1}"
              f"{_ratio(got.memory_gib, case.memory_gib):>7}"
              f"{mfu:>7.1%}{'' if case.mfu is not None else '+':1}"
              f"{got.tokens_per_s * flops / peak:>6.1%}{got.plan.mfu or 0:>9.1%}")
        for label, predicted, published in (("throughput", got.tokens_per_s,
                                             case.tokens_per_s),
                                            ("memory", got.memory_gib, case.memory_gib)):
            if published is not None and abs(predicted / published - 1) > TOLERANCE:
                off.append(f"{name} {label}: predicted {predicted:,.4g}, published "
                           f"{published:,.4g} ({predicted / published:.2f}x)")
    print("tok/s/GPU, GiB: published; pred: predicted; hidden: predicted tok/s/GPU with all "
          "communication hidden; * no plan of the strategy fits the device. MFU: "
          "torchtitan's formula at the published throughput (+ derived: not published), "
          "pred: at the predicted one; autopar: Plan.mfu (against the profile's peak).")
    return off


def main() -> None:
    args = parse_cases(case_parser(__doc__.splitlines()[0], CASES, 30.0,
                                   (QUICK_CASES, QUICK_TIME_LIMIT)))
    start = time.monotonic()
    rows = []
    for name in args.case or tuple(CASES):
        case = CASES[name]
        got = predict(case, args.time_limit)
        describe(name, case, got)
        rows.append((name, case, got))
    print()
    off = table(rows)
    for line in off:
        print(f"off by more than {TOLERANCE:.0%}: {line}")
    print(f"{len(rows)} case(s) in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
