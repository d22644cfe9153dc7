"""autopar's predictions against Megatron-LM's published weak-scaling table: GPT models of
1.7B to 462B parameters on 48 to 6144 H100s (NVIDIA/Megatron-LM, README.md, "Training
Speed and Scalability", images/model_table.png), each planned with the hand strategy of its
configuration, and the solver's own plan beside it.

    python benchmarks/published_megatron.py                   # every case
    python benchmarks/published_megatron.py --case 177b --solver
    python benchmarks/published_megatron.py --quick           # the 1.7B case, 5 s solves

A case builds transformers' GPT-2 classes on the meta device in bfloat16 at the table's
shape (vocabulary 131,072, sequence 4096, feed-forward 4 x hidden, learned positions,
tied embeddings: Megatron-LM's GPT defaults), the global batch of the table, trained in the
cost model by AdamW with fp32 master weights and states, as Megatron-LM trains bf16 models.
The mesh is (pp, dp, tp) of the table's sizes on `h100-sxm` (80 GB, size-1 axes left out).
The hand strategy is Megatron-LM's: tensor parallel over tp, the distributed optimizer over
dp (`--use-distributed-optimizer`, role "dopt"), selective recomputation (every output of
low arithmetic intensity recomputed), micro-batches of one sample; over pp the "Megatron 3D"
strategy (`autopar.planning.pipeline.megatron_3d`), whose pipeline planner chooses the
schedule and the micro-batch count. The table does not say which recomputation the runs
used; selective is Megatron-LM's recommended setting for models of this size.

Throughput is Megatron-LM's own: teraFLOP/s per GPU are its model FLOPs per step
(`megatron_flops`, the formula of Narayanan et al. 2021 without recomputation, which
reproduces every MFU of the table against the H100's 989 TFLOP/s: `tests/test_published.py`)
over the step time and the GPUs. The table prints the published and the predicted figures,
their ratio, the plan's peak memory against the device's 80 GB, and with `--solver`
the step of `autopar.plan` at its defaults with this hand strategy offered
(`hand_strategies=`): the plan it returns is never slower than a hand strategy that fits.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
# The loss wrapper the transformers tests train with.
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

from case_options import case_parser, parse_cases  # noqa: E402
from hf_models import CausalLMLoss  # noqa: E402

import autopar  # noqa: E402
from autopar.costs.optimizer_state import optimizer_state  # noqa: E402
from autopar.errors import InfeasiblePlanError  # noqa: E402
from autopar.passes.capturing.annotate import annotate  # noqa: E402
from autopar.passes.capturing.capture import capture  # noqa: E402
from autopar.passes.strategies.restrict import restrict  # noqa: E402
from autopar.planning.deadline import Deadline  # noqa: E402
from autopar.planning.graph import default_budget, plan_table, strategy_tables  # noqa: E402
from autopar.planning.hand_strategies import MEGATRON_3D  # noqa: E402
from autopar.planning.pipeline.megatron_3d import megatron_3d  # noqa: E402

VOCAB, SEQ = 131072, 4096
H100_PEAK = 989e12  # dense bf16, the H100 SXM datasheet's: what the table's MFU divides by
HARDWARE = "h100-sxm"
SOURCE = "NVIDIA/Megatron-LM README.md, Training Speed and Scalability (model_table.png)"
MASTER = optimizer_state(torch.optim.AdamW, master_weights=torch.float32)
TOLERANCE = 0.15  # relative, as benchmarks/published.py


@dataclass(frozen=True)
class Run:
    """One row of the table: the GPT shape, the parallel sizes, the global batch (sequences
    of `SEQ`) and the published teraFLOP/s per GPU and MFU."""

    size: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    dp: int
    batch: int
    tflops: float
    mfu: float

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def mesh(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The (pp, dp, tp) mesh of the run, its size-1 axes but dp left out."""
        sizes = [(n, a) for n, a in ((self.pp, "pp"), (self.dp, "dp"), (self.tp, "tp"))
                 if n > 1 or a == "dp"]
        return tuple(n for n, _ in sizes), tuple(a for _, a in sizes)


CASES = {run.size.lower(): run for run in (
    Run("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8, 0.41),
    Run("7.1B", 32, 4096, 30, 2, 1, 48, 192, 465.9, 0.47),
    Run("16B", 48, 6144, 32, 4, 1, 48, 192, 489.1, 0.49),
    Run("32B", 56, 7168, 48, 8, 1, 48, 192, 459.6, 0.46),
    Run("70B", 64, 8192, 84, 8, 2, 48, 384, 419.7, 0.42),
    Run("119B", 80, 10240, 92, 8, 4, 48, 768, 420.5, 0.43),
    Run("177B", 96, 12288, 96, 8, 6, 48, 1152, 432.8, 0.44),
    Run("314B", 128, 16384, 96, 8, 8, 48, 1536, 474.4, 0.48),
    Run("462B", 144, 18432, 112, 8, 16, 48, 3072, 459.9, 0.47),
)}
QUICK_CASES, QUICK_TIME_LIMIT = ("1.7b",), 5.0


def megatron_flops(run: Run) -> float:
    """Model FLOPs of one step (Narayanan et al. 2021, eq. 3 without the recomputed
    forward): 72 B s l h^2 (1 + s / 6h + V / 12 l h)."""
    b, s, layers, h = run.batch, SEQ, run.layers, run.hidden
    return 72 * b * s * layers * h * h * (1 + s / (6 * h) + VOCAB / (12 * layers * h))


def build(run: Run, batch: int | None = None) -> tuple[nn.Module, tuple]:
    """The run's GPT on the meta device in bfloat16 and `batch` sequences of token ids
    (default: the run's global batch). GELU is torch's (erf), as Megatron-LM's."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=run.hidden,
                        n_layer=run.layers, n_head=run.heads, use_cache=False,
                        activation_function="gelu", attn_implementation="sdpa",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    with torch.device("meta"):
        lm = GPT2LMHeadModel(config).to(torch.bfloat16)
    lm.loss_type = "ForCausalLM"
    ids = torch.zeros(batch or run.batch, SEQ, dtype=torch.long, device="meta")
    return CausalLMLoss(lm), (ids, ids)


@dataclass(frozen=True)
class Predicted:
    """A row planned: the hand strategy's plan, whether it fits the device (or why there
    is none), and with `--solver` the plan `autopar.plan` returns; the seconds each took."""

    plan: autopar.Plan | None  # the hand strategy's (None: none found)
    fits: bool
    note: str  # why there is no plan, where there is none
    solver: autopar.Plan | None  # autopar.plan's with the hand strategy offered
    plan_s: float
    solver_s: float

    def tflops(self, run: Run, plan: autopar.Plan | None = None) -> float:
        plan = plan or self.plan
        return megatron_flops(run) / (plan.step_time_s * run.gpus) / 1e12


def hand_plan(run: Run, model: nn.Module, inputs: tuple, time_limit: float
              ) -> tuple[autopar.Plan | None, bool, str]:
    """The run's hand strategy planned (module docstring): its fastest plan within the
    device's budget, else its fastest (then not fitting), and why there is none."""
    mesh = autopar.Mesh(*run.mesh, hardware=HARDWARE)
    budget = default_budget(mesh, None)
    if run.pp > 1:
        gm = annotate(capture(model, inputs))
        record, plan = megatron_3d(model, gm, inputs, mesh, memory_budget=budget,
                                   time_limit=time_limit, fold_layers=True, seed=0,
                                   optimizer=MASTER, deadline=Deadline(time_limit * 4))
        needs = (f"; its fastest needs {record.peak_memory_bytes / 2**30:.1f} GiB"
                 if record.peak_memory_bytes else "")
        return plan, plan is not None, f"Megatron 3D: {record.note or 'no plan'}{needs}"
    micro = run.batch // run.dp  # one sample a micro-batch: the graph runs `micro` times
    model, inputs = build(run, run.dp)
    gm = annotate(capture(model, inputs))
    tables = strategy_tables(gm, mesh, fold_layers=True, recompute=True, microbatches=micro)
    roles = ("dopt",) + (("tp",) if run.tp > 1 else ())
    options = dict(model_name=f"GPT {run.size}", time_limit=time_limit, fold_layers=True,
                   seed=0, microbatches=micro, optimizer=MASTER)
    table = restrict(tables.gm, tables.found, mesh, roles, "selective").table
    for limit in (budget, None):
        try:
            plan = plan_table(tables.gm, table, mesh, memory_budget=limit, **options)
        except InfeasiblePlanError:
            continue
        return plan, plan.peak_memory_bytes <= budget, ""
    return None, False, "no plan within the restriction"


def predict(run: Run, time_limit: float, solver: bool) -> Predicted:
    model, inputs = build(run)
    start = time.monotonic()
    plan, fits, note = hand_plan(run, model, inputs, time_limit)
    planned = time.monotonic()
    chosen = None
    if solver:
        mesh = autopar.Mesh(*run.mesh, hardware=HARDWARE)
        names = (MEGATRON_3D,) if run.pp > 1 else (
            "Megatron TP + selective recompute + distributed optimizer",) if run.tp > 1 else ()
        chosen = autopar.plan(model, mesh, inputs, optimizer=torch.optim.AdamW,
                              master_weights=torch.float32, hand_strategies=names)
    return Predicted(plan, fits, note, chosen, planned - start, time.monotonic() - planned)


def describe(run: Run, got: Predicted) -> None:
    print(f"## GPT {run.size}: {run.layers} layers, hidden {run.hidden}, {run.heads} heads, "
          f"TP {run.tp} x PP {run.pp} x DP {run.dp} = {run.gpus} H100, batch {run.batch}")
    plan = got.plan
    if plan is None:
        print(f"no plan of the hand strategy found ({got.note})")
        return
    pipe = plan.pipeline
    shape = (f"{pipe.schedule}, {pipe.microbatches} micro-batches, bubble {pipe.bubble:.0%}"
             if pipe is not None else f"{plan.microbatches} micro-batch(es)")
    print(f"hand strategy ({shape}) planned in {got.plan_s:.0f} s: step {plan.step_time_s:.3f} s "
          f"(compute {plan.compute_s:.3f}, communication {plan.exposed_comm_s:.3f} exposed + "
          f"{plan.hidden_comm_s:.3f} hidden, optimizer {plan.optimizer_s:.3f}); published "
          f"step {megatron_flops(run) / (run.tflops * 1e12 * run.gpus):.3f} s; peak "
          f"{plan.peak_memory_bytes / 2**30:.1f} GiB "
          f"{'within' if got.fits else 'over'} the budget")
    if got.solver is not None:
        print(f"autopar.plan (hand strategy offered) in {got.solver_s:.0f} s: step "
              f"{got.solver.step_time_s:.3f} s, {got.solver.peak_memory_bytes / 2**30:.1f} GiB")


def table(rows: list[tuple[Run, Predicted]]) -> list[str]:
    """Print the table; return the figures off by more than `TOLERANCE` or not fitting."""
    print(f"{'case':<7}{'GPUs':>6}{'TFLOP/s':>9}{'pred':>7}{'ratio':>7}{'MFU':>6}{'pred':>7}"
          f"{'GiB':>7}{'fits':>6}{'solver':>8}")
    off = []
    for run, got in rows:
        if got.plan is None:
            off.append(f"{run.size}: no plan of the hand strategy")
            continue
        tflops = got.tflops(run)
        solver = "-" if got.solver is None else f"{got.tflops(run, got.solver):.0f}"
        print(f"{run.size:<7}{run.gpus:>6}{run.tflops:>9.1f}{tflops:>7.1f}"
              f"{tflops / run.tflops:>7.3f}{run.mfu:>6.0%}{tflops * 1e12 / H100_PEAK:>7.1%}"
              f"{got.plan.peak_memory_bytes / 2**30:>7.1f}{'yes' if got.fits else 'NO':>6}"
              f"{solver:>8}")
        if abs(tflops / run.tflops - 1) > TOLERANCE:
            off.append(f"{run.size} throughput: predicted {tflops:.1f} TFLOP/s a GPU, "
                       f"published {run.tflops} ({tflops / run.tflops:.2f}x)")
        if not got.fits:
            off.append(f"{run.size} memory: {got.plan.peak_memory_bytes / 2**30:.1f} GiB "
                       "over the 80 GB device's budget")
        if got.solver is not None and got.fits and \
                got.solver.step_time_s > got.plan.step_time_s * (1 + 1e-9):
            off.append(f"{run.size}: the solver's plan is slower than the hand strategy")
    print("TFLOP/s: per GPU, Megatron-LM's model FLOPs (`megatron_flops`) over the step; "
          "MFU against 989 TFLOP/s; GiB: the hand strategy's peak on an 80 GB H100; solver: "
          "autopar.plan's TFLOP/s with the hand strategy offered (--solver).")
    return off


def main() -> None:
    parser = case_parser(__doc__.splitlines()[0], CASES, 30.0, (QUICK_CASES, QUICK_TIME_LIMIT))
    parser.add_argument("--solver", action="store_true",
                        help="also plan with autopar.plan at its defaults, the hand strategy "
                             "offered")
    args = parse_cases(parser)
    start = time.monotonic()
    rows = []
    for name in args.case or tuple(CASES):
        run = CASES[name]
        got = predict(run, args.time_limit, args.solver)
        describe(run, got)
        rows.append((run, got))
    print()
    for line in table(rows):
        print(f"off: {line}")
    print(f"{len(rows)} case(s) in {time.monotonic() - start:.0f} s; {SOURCE}")


if __name__ == "__main__":
    main()
