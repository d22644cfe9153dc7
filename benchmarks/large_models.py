"""Plan Llama-shaped models from `transformers` configs at the sizes people train, and print
what the solver chose: predicted step time, MFU, peak memory, micro-batches, what it
recomputes and how it stores the parameters.

    python benchmarks/large_models.py              # 70B on 8x8 H100, 8B on 8x8 H100
    python benchmarks/large_models.py --case 8b    # one case
    python benchmarks/large_models.py --case 70b-3d --case 405b-3d   # pipelined, 3D meshes
    python benchmarks/large_models.py --quick      # a 2-layer Llama of width 256, 5 s solves

Models are built on the meta device in bfloat16 (nothing is allocated) and trained, in the
cost model, by AdamW with fp32 master weights and states (the Megatron recipe). The MFU is
the plan's: 6 x parameters x tokens plus attention FLOPs (counted from the graph, as
forward + 2 x forward) over predicted step x devices x bf16 peak.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The loss wrapper the transformers tests train with.
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

from case_options import case_parser, parse_cases  # noqa: E402
from hf_models import CausalLMLoss  # noqa: E402

import autopar  # noqa: E402
from autopar.present.summary import describe_context_parallel  # noqa: E402


@dataclass(frozen=True)
class Case:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    batch: int
    seq: int
    mesh: tuple[int, ...] = (8, 8)
    axes: tuple[str, ...] = ("dp", "tp")
    hand: tuple[str, ...] = ()  # hand strategies to plan next to the solver's plan


CASES = {
    "70b": Case("Llama-3-70B shape", 80, 8192, 64, 8, 28672, 128256, 64, 4096),
    "8b": Case("Llama-3-8B shape", 32, 4096, 32, 8, 14336, 128256, 64, 8192),
    "8b-131k": Case("Llama-3-8B shape", 32, 4096, 32, 8, 14336, 128256, 8, 131072,
                    hand=("CP x TP x FSDP",)),
    "8b-4k": Case("Llama-3-8B shape", 32, 4096, 32, 8, 14336, 128256, 256, 4096),
    "70b-3d": Case("Llama-3-70B shape", 80, 8192, 64, 8, 28672, 128256, 512, 4096,
                   (2, 8, 8), ("pp", "dp", "tp")),
    "405b-3d": Case("Llama-3-405B shape", 126, 16384, 128, 8, 53248, 128256, 1024, 4096,
                    (8, 8, 8), ("pp", "dp", "tp")),
    # `--quick`'s: every step of a report (a hand strategy too) on a tiny model.
    "tiny": Case("tiny Llama shape", 2, 256, 4, 2, 512, 1024, 8, 256,
                 hand=("CP x TP x FSDP",)),
}
QUICK_CASES, QUICK_TIME_LIMIT = ("tiny",), 5.0


def build(case: Case) -> tuple[nn.Module, tuple]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=case.vocab, hidden_size=case.hidden,
                         intermediate_size=case.ffn, num_hidden_layers=case.layers,
                         num_attention_heads=case.heads, num_key_value_heads=case.kv_heads,
                         max_position_embeddings=case.seq, use_cache=False,
                         attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    with torch.device("meta"):
        lm = LlamaForCausalLM(config).to(torch.bfloat16)
    lm.loss_type = "ForCausalLM"
    ids = torch.zeros(case.batch, case.seq, dtype=torch.long, device="meta")
    return CausalLMLoss(lm), (ids, ids)


def report(case: Case, time_limit: float) -> None:
    model, inputs = build(case)
    params = sum(p.numel() for p in model.parameters())
    mesh = autopar.Mesh(case.mesh, case.axes, hardware="h100-sxm")
    start = time.monotonic()
    plan = autopar.plan(model, mesh, inputs, optimizer=torch.optim.AdamW,
                        master_weights=torch.float32, time_limit=time_limit)
    took = time.monotonic() - start
    layer0 = [n for n in plan.nodes if ".layers.0." in n.module or n.module.endswith("layers.0")]
    recomputed = Counter(n.op.removeprefix("aten.").split(".")[0] for n in layer0 if n.recompute)
    kept = Counter(n.op.removeprefix("aten.").split(".")[0] for n in layer0
                   if n.role == "op" and not n.recompute and n.memory_bytes > 0)
    storage = Counter((n.output, n.gathered + (" whole gradient" if n.whole_gradient else ""))
                      for n in plan.nodes if n.role == "parameter"
                      and ".layers.0." in n.module + ".")
    print(f"## {case.name}: {params / 1e9:.1f} B parameters, batch {case.batch} x {case.seq}, "
          f"mesh {mesh.describe()}")
    print(f"planned in {took:.0f} s; solver {plan.solver.status}, gap {plan.solver.gap:.2%}; "
          f"{plan.microbatches} micro-batch(es) per step")
    print(f"predicted step {plan.step_time_s:.3f} s (compute {plan.compute_s:.3f}, "
          f"communication {plan.exposed_comm_s:.3f} exposed + {plan.hidden_comm_s:.3f} "
          f"hidden), MFU {plan.mfu:.3f}")
    print(f"peak memory {plan.peak_memory_bytes / 2**30:.2f} GiB of "
          f"{plan.memory_limit_bytes / 2**30:.2f} GiB; optimizer {plan.optimizer}")
    seconds: dict[str, float] = {}
    for node in plan.nodes:
        for t in node.transfers:
            key = f"{t.kind} {t.axis} {'backward' if t.backward else 'forward'}"
            seconds[key] = seconds.get(key, 0.0) + t.seconds
    print("communication by collective (s, before overlap):",
          ", ".join(f"{key} {value:.3f}" for key, value in sorted(
              seconds.items(), key=lambda item: -item[1])))
    print(f"context parallel: {describe_context_parallel(plan)}")
    print(f"layer 0 recomputes: {dict(recomputed) or 'nothing'}")
    print(f"layer 0 keeps: {dict(kept)}")
    print("layer 0 parameters (stored, kept gathered):",
          {f"{out} / {gathered or '-'}": count for (out, gathered), count in storage.items()})
    if plan.pipeline is not None:
        record = plan.pipeline
        print(f"pipeline over {record.axis}: {record.schedule}, {record.microbatches} "
              f"micro-batches, {len(record.stages)} stages of "
              f"{sorted({s.units[1] - s.units[0] + 1 for s in record.stages})} blocks, "
              f"bubble {record.bubble:.1%}")
    if "pp" in case.axes:
        _compare_megatron_3d(model, inputs, mesh, plan, time_limit)
    if case.hand:
        _compare_hand(model, inputs, mesh, plan, case.hand, time_limit)
    print()


def _compare_hand(model, inputs, mesh: autopar.Mesh, plan: autopar.Plan,
                  names: tuple[str, ...], time_limit: float) -> None:
    """The named standard hand strategies, planned with the plan's micro-batches under the
    same cost model, next to the plan."""
    start = time.monotonic()
    with_hand = autopar.plan(model, mesh, inputs, optimizer=torch.optim.AdamW,
                             master_weights=torch.float32, time_limit=time_limit,
                             microbatches=plan.microbatches, hand_strategies=names)
    took = time.monotonic() - start
    for record in with_hand.hand_strategies:
        if record.name in names:
            _print_against(f"{record.name} ({took:.0f} s, {record.description})", record, plan)


def _compare_megatron_3d(model, inputs, mesh: autopar.Mesh, plan: autopar.Plan,
                         time_limit: float) -> None:
    """The Megatron 3D hand strategy under the same cost model, next to the plan."""
    from autopar.costs.optimizer_state import optimizer_state
    from autopar.passes.capturing.annotate import annotate
    from autopar.passes.capturing.capture import capture
    from autopar.planning.graph import default_budget
    from autopar.planning.pipeline.megatron_3d import megatron_3d

    start = time.monotonic()
    record, _ = megatron_3d(model, annotate(capture(model, inputs)), inputs, mesh,
                            memory_budget=default_budget(mesh, None), time_limit=time_limit,
                            fold_layers=True, seed=0,
                            optimizer=optimizer_state(torch.optim.AdamW,
                                                      master_weights=torch.float32))
    took = time.monotonic() - start
    _print_against(f"Megatron 3D ({took:.0f} s)", record, plan)


def _print_against(label: str, record, plan: autopar.Plan) -> None:
    """A hand strategy's record next to the plan: step, MFU, peak memory, fit."""
    if record.step_time_s is None:
        print(f"{label}: {record.note}")
        return
    mfu = plan.mfu * plan.step_time_s / record.step_time_s if plan.mfu else float("nan")
    print(f"{label}: step {record.step_time_s:.3f} s, MFU {mfu:.3f}, "
          f"peak {record.peak_memory_bytes / 2**30:.2f} GiB, "
          f"{'fits' if record.fits else 'does not fit'}; "
          f"{record.note + '; ' if record.note else ''}solver's plan "
          f"{plan.step_time_s / record.step_time_s:.3f} x its step")


def main() -> None:
    args = parse_cases(case_parser(__doc__.splitlines()[0], CASES, 60.0,
                                   (QUICK_CASES, QUICK_TIME_LIMIT)))
    for name in args.case or ("70b", "8b"):
        report(CASES[name], args.time_limit)


if __name__ == "__main__":
    main()
