"""Plan Llama-shaped models as they serve, on the meta device, and print what the plan
predicts next to the hand strategies under the same cost model: time per output token (the
decode program's latency), memory per device, the KV cache's bytes per device and the
tokens it holds, and how long planning took.

    python benchmarks/serving.py                  # 70B on 8 H100s, 405B on 2 x 8
    python benchmarks/serving.py --case 405b-2x8  # one case
    python benchmarks/serving.py --quick          # a 2-layer Llama of width 256, 5 s solves

Then each case's throughput (`objective="throughput"`): the batch, grown from the case's,
whose plan serves the most tokens a second, planned freely and under the rule of thumb.

Each model is `autopar.CachedLM(lm, batch, max_len=context)` in bfloat16, planned for
decoding one token per sequence with `training=False` and `prefill=` the case's prompt
length, at default options otherwise: the time printed is that call's, its plan's prefill
(planned with the decode plan's weights and cache pinned, as `autopar.compile_prefill`
compiles it) the predicted time to first token. A second call costs the hand strategies
under the same cost model; the rule of thumb is Megatron tensor parallelism over one node
("Megatron tensor parallel"), and over several nodes tensor parallel within and pipeline
across ("Megatron 3D": vLLM's guide, tensor parallel = GPUs per node, pipeline parallel =
nodes). A mesh whose outer axis is named "pp" lets the planner pipeline over it too.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from case_options import case_parser, parse_cases  # noqa: E402
from large_models import Case  # noqa: E402

import autopar  # noqa: E402

# The hand strategies a serving plan is compared with: the rule of thumb's, and the others.
RULES_OF_THUMB = ("Megatron tensor parallel", "Megatron 3D")
OTHERS = ("data parallel", "fully sharded (ZeRO-3)", "data x tensor parallel")


# The model shapes, batch and context (`seq`) and mesh of each case, as large_models.py
# describes a training case, and the prompt length its prefill is planned for.
CASES = {
    "70b-8": Case("Llama-3-70B shape", 80, 8192, 64, 8, 28672, 128256, 32, 8192,
                  (8,), ("tp",)),
    "405b-2x8": Case("Llama-3-405B shape", 126, 16384, 128, 8, 53248, 128256, 16, 8192,
                     (2, 8), ("pp", "tp")),
    "tiny": Case("tiny Llama shape", 2, 256, 4, 2, 512, 1024, 4, 256, (2, 2), ("pp", "tp")),
}
PROMPTS = {"70b-8": 1024, "405b-2x8": 1024, "tiny": 64}
QUICK_CASES, QUICK_TIME_LIMIT = ("tiny",), 5.0


def build(case: Case) -> nn.Module:
    """The case's causal LM with a static cache of `batch` x `seq` tokens, on meta."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=case.vocab, hidden_size=case.hidden,
                         intermediate_size=case.ffn, num_hidden_layers=case.layers,
                         num_attention_heads=case.heads, num_key_value_heads=case.kv_heads,
                         max_position_embeddings=case.seq, attn_implementation="sdpa",
                         torch_dtype=torch.bfloat16)
    with torch.device("meta"):
        lm = LlamaForCausalLM(config).to(torch.bfloat16).eval()
        return autopar.CachedLM(lm, batch=case.batch, max_len=case.seq)


def report(case: Case, prompt: int, time_limit: float) -> None:
    served = build(case)
    params = sum(p.numel() for p in served.parameters())
    mesh = autopar.Mesh(case.mesh, case.axes, hardware="h100-sxm")
    ids = torch.zeros(case.batch, 1, dtype=torch.long, device="meta")
    start = time.monotonic()
    plan = autopar.plan(served, mesh, (ids, torch.zeros(1, dtype=torch.long, device="meta")),
                        training=False, prefill=prompt, time_limit=time_limit)
    took = time.monotonic() - start
    hand = autopar.plan(served, mesh, (ids, torch.zeros(1, dtype=torch.long, device="meta")),
                        training=False, hand_strategies=RULES_OF_THUMB + OTHERS,
                        time_limit=time_limit).hand_strategies
    gib = 2 ** 30
    print(f"## {case.name}: {params / 1e9:.1f} B parameters, batch {case.batch}, context "
          f"{case.seq}, mesh {mesh.describe()}")
    print(f"planned in {took:.1f} s (the decode plan {plan.solver.planning_s:.1f} s, then its "
          f"prefill); solver {plan.solver.status}, gap {plan.solver.gap:.2%}")
    layout = "no pipeline" if plan.pipeline is None else (
        f"pipeline over {plan.pipeline.axis}: {len(plan.pipeline.stages)} stages")
    print(f"predicted {plan.step_time_s * 1e3:.1f} ms per output token "
          f"({case.batch / plan.step_time_s:.0f} tokens/s), {layout}")
    print(f"peak memory {plan.peak_memory_bytes / gib:.1f} of "
          f"{plan.memory_limit_bytes / gib:.1f} GiB; KV cache "
          f"{plan.kv_cache_bytes / gib:.2f} GiB per device, {plan.kv_cache_tokens} tokens")
    if plan.prefill_tokens:
        print(f"predicted time to first token ({plan.prefill_tokens}-token prompts) "
              f"{plan.prefill_s * 1e3:.0f} ms, prefill peak {plan.prefill_peak_bytes / gib:.1f} "
              "GiB")
    print(f"{'strategy':<28} {'ms/token':>9} {'peak GiB':>9} {'fits':>5} {'plan/it':>8}")
    for record in hand:
        if record.step_time_s is None:
            print(f"{record.name:<28} {'-':>9} {'-':>9} {'-':>5} {'-':>8}  {record.note}")
            continue
        mark = " (rule of thumb)" if record.name in RULES_OF_THUMB else ""
        print(f"{record.name:<28} {record.step_time_s * 1e3:9.1f} "
              f"{record.peak_memory_bytes / gib:9.1f} {'yes' if record.fits else 'no':>5} "
              f"{plan.step_time_s / record.step_time_s:8.3f}{mark}")
    print()


def throughput(case: Case, time_limit: float) -> None:
    """The batch serving the most tokens a second (`objective="throughput"`), planned freely
    and under the rule of thumb (its own batch search), side by side."""
    served = build(case)
    mesh = autopar.Mesh(case.mesh, case.axes, hardware="h100-sxm")
    inputs = (torch.zeros(case.batch, 1, dtype=torch.long, device="meta"),
              torch.zeros(1, dtype=torch.long, device="meta"))
    rule = RULES_OF_THUMB[0] if len(case.mesh) == 1 else RULES_OF_THUMB[1]
    print(f"### throughput, from batch {case.batch} (context {case.seq})")
    print(f"{'strategy':<42} {'batch':>6} {'tokens/s':>10} {'ms/token':>9} {'peak GiB':>9} "
          f"{'planned s':>10}")
    for name, strategy in (("planned", None), (f"{rule} (rule of thumb)", rule)):
        start = time.monotonic()
        try:
            plan = autopar.plan(served, mesh, inputs, training=False, objective="throughput",
                                strategy=strategy, time_limit=time_limit)
        except autopar.AutoparError as exc:
            print(f"{name:<42} {'-':>6} {'-':>10}  {str(exc).splitlines()[0]}")
            continue
        batch = plan.serving_batch
        tokens = dict(plan.serving)[batch]
        print(f"{name:<42} {batch:>6} {tokens:10,.0f} {plan.step_time_s * 1e3:9.1f} "
              f"{plan.peak_memory_bytes / 2 ** 30:9.1f} {time.monotonic() - start:10.1f}")
    print()


def main() -> None:
    args = parse_cases(case_parser(__doc__.splitlines()[0], CASES, 30.0,
                                   (QUICK_CASES, QUICK_TIME_LIMIT)))
    for name in args.case or ("70b-8", "405b-2x8"):
        report(CASES[name], PROMPTS[name], args.time_limit)
        throughput(CASES[name], args.time_limit)


if __name__ == "__main__":
    main()
