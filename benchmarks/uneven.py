"""Plans of models whose dims do not divide the mesh, beside the same model made to divide.

    python benchmarks/uneven.py              # the 8B shape, vocabulary 128256 and 128257, 8x8
    python benchmarks/uneven.py --case gpt2  # GPT-2 small, vocabulary 50256 and 50257, on 8
    python benchmarks/uneven.py --quick      # a 2-layer Llama of width 256, 5 s solves

A dim that does not divide is cut as DTensor cuts it (the first pieces one row longer), so
a vocabulary of 128256 + 1 should plan as 128256 does: the table prints both plans'
predicted step, peak memory, how the output head is stored and its pieces, and the ratio
of the steps (the odd vocabulary's over the even one's).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from case_options import case_parser, parse_cases  # noqa: E402
from large_models import CASES as LLAMA  # noqa: E402
from large_models import build  # noqa: E402

import autopar  # noqa: E402

CASES = {
    "8b": LLAMA["8b"],
    "gpt2": dataclasses.replace(LLAMA["tiny"], name="GPT-2 small shape", layers=12,
                                hidden=768, heads=12, kv_heads=12, ffn=3072, vocab=50256,
                                batch=8, seq=1024, mesh=(8,), axes=("dp",), hand=()),
    "tiny": LLAMA["tiny"],
}
QUICK_CASES, QUICK_TIME_LIMIT = ("tiny",), 5.0


def _head(plan: autopar.Plan) -> tuple[str, str]:
    """How the output head's weight is stored, and its pieces where uneven."""
    head = next(n for n in plan.nodes if n.role == "parameter" and "lm_head" in n.name)
    return head.output, head.pieces or "even"


def report(case, time_limit: float | None) -> None:
    print(f"## {case.name} on {'x'.join(map(str, case.mesh))} h100-sxm, batch {case.batch} x "
          f"{case.seq}")
    print("| vocabulary | step | peak memory | head stored | head pieces | planned in |")
    print("|---|---|---|---|---|---|")
    steps = []
    for vocab in (case.vocab, case.vocab + 1):
        model, inputs = build(dataclasses.replace(case, vocab=vocab))
        mesh = autopar.Mesh(case.mesh, case.axes, hardware="h100-sxm")
        start = time.monotonic()
        plan = autopar.plan(model, mesh, inputs, optimizer=torch.optim.AdamW,
                            master_weights=torch.float32,
                            **({"time_limit": time_limit} if time_limit else {}))
        took = time.monotonic() - start
        stored, pieces = _head(plan)
        steps.append(plan.step_time_s)
        print(f"| {vocab} | {plan.step_time_s * 1e3:.1f} ms | "
              f"{plan.peak_memory_bytes / 2**30:.2f} GiB | {stored} | {pieces} | {took:.0f} s |")
    print(f"\nodd over even: {steps[1] / steps[0]:.4f}\n")


def main() -> None:
    # No time limit given: the planner's default, as a user calls it.
    args = parse_cases(case_parser(__doc__, CASES, None, (QUICK_CASES, QUICK_TIME_LIMIT)))
    for name in args.case or ("8b",):
        report(CASES[name], args.time_limit)


if __name__ == "__main__":
    main()
