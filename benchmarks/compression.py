"""What compression gains, predicted, and that training with compressed gradients converges
as the exact run does: loss curves side by side.

    python benchmarks/compression.py           # GPT (small), 300 AdamW steps on 4 gloo ranks
    python benchmarks/compression.py --quick   # 30 steps on 2 ranks, a smaller GPT planned

First a table: a GPT of 1B parameters in fp32 (20 blocks of width 2048, batch 32 x 512;
`--quick`: 4 blocks of width 1024), planned on the meta device over two nodes of 8 on
100 Gb/s Ethernet (`h100-ethernet`) as data parallelism and as ZeRO-3, with each
compression allowed alone and with "auto": the predicted step, the peak memory per device,
and what the solver chose (how many parameters took which).

The example GPT (2 blocks of width 256) learns sequences drawn from a fixed random Markov
chain (each token followed by one of 4, so the best loss is about ln 4 = 1.39 nats), a
fresh batch each step, the same on every rank. It is planned as data parallelism over the
slow links of `h100-ethernet`, where the solver, allowed PowerSGD of rank 4, compresses the
weights' gradients, and trained on CPU ranks (gloo) twice from the same weights: with that
plan and with the exact one, AdamW at `autopar run`'s learning rate (1e-3; the exact run
ends lower there than at 3e-3). Printed: both losses every few steps with their ratio, the
final loss (the mean of the last 10 steps) of each, a text plot of both curves, and the
bytes one compressed step moved against the plan's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import autopar  # noqa: E402
from autopar.runtime.launch import launch  # noqa: E402
from autopar.tools.training import LEARNING_RATE  # noqa: E402
from examples import gpt  # noqa: E402

SIZES = {"vocab": 256, "seq": 32, "hidden": 256, "heads": 4, "layers": 2, "batch": 16}
SUCCESSORS, TAIL = 4, 10
COMPRESSION = "powersgd-4"


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s batch of the chain: (tokens, the tokens that follow them)."""
    table = torch.randint(SIZES["vocab"], (SIZES["vocab"], SUCCESSORS),
                          generator=torch.Generator().manual_seed(1234))
    generator = torch.Generator().manual_seed(step)
    tokens = [torch.randint(SIZES["vocab"], (SIZES["batch"],), generator=generator)]
    for _ in range(SIZES["seq"]):
        choice = torch.randint(SUCCESSORS, (SIZES["batch"],), generator=generator)
        tokens.append(table[tokens[-1], choice])
    sequence = torch.stack(tokens, dim=1)
    return sequence[:, :-1].contiguous(), sequence[:, 1:].contiguous()


def train(rank: int, plan: dict, steps: int) -> dict:
    """`steps` AdamW steps under `plan` on the chain's batches: the losses, and the bytes
    the last step moved beside the plan's."""
    torch.manual_seed(0)
    model, _ = gpt.build(**SIZES)
    planned = autopar.Plan.from_dict(plan)
    pm = autopar.compile(model, planned.mesh, batch(0), plan=planned)
    optimizer = torch.optim.AdamW(pm.parameters(), lr=LEARNING_RATE)
    losses = []
    for step in range(steps):
        if step == steps - 1:
            pm.counter.reset()
        optimizer.zero_grad()
        loss = pm(*batch(step))
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "measured": dict(pm.counter.totals()),
            "predicted": {k: v for k, v in pm.plan.comm_bytes().items() if v}}


def plot(curves: dict[str, list[float]], width: int = 60, height: int = 14) -> str:
    """The curves as text: step across, loss up, one letter per curve ('*' where both)."""
    top = max(max(c) for c in curves.values())
    bottom = min(min(c) for c in curves.values())
    grid = [[" "] * width for _ in range(height)]
    steps = len(next(iter(curves.values())))
    for letter, curve in zip("eP", curves.values()):
        for column in range(width):
            value = curve[min(steps - 1, column * steps // width)]
            row = round((top - value) / (top - bottom or 1) * (height - 1))
            grid[row][column] = "*" if grid[row][column] not in (" ", letter) else letter
    labels = [f"{top - i * (top - bottom) / (height - 1):6.2f} |" for i in range(height)]
    legend = "  ".join(f"{letter}: {name}" for letter, name in zip("eP", curves))
    return "\n".join(label + "".join(row) for label, row in zip(labels, grid)) + \
        f"\n{'':7}+{'-' * width}\n{'':8}step 0 .. {steps - 1}    {legend}"


def predicted(quick: bool) -> None:
    """The table of predicted steps per strategy and compression (module docstring)."""
    size = {"hidden": 1024, "layers": 4} if quick else {"hidden": 2048, "layers": 20}
    model, inputs = gpt.build(vocab=32000, seq=512, heads=16, batch=32, device="meta", **size)
    mesh = autopar.Mesh((2, 8), ("node", "gpu"), hardware="h100-ethernet")
    print(f"## GPT of {size['layers']} blocks of width {size['hidden']} (fp32, batch 32 x "
          f"512) on {mesh.describe()}, predicted")
    print("| strategy | allowed | step ms | vs exact | peak GiB | chosen |")
    print("|---|---|---|---|---|---|")
    for strategy in ("data parallel", "fully sharded (ZeRO-3)"):
        exact = None
        for allowed in (None, "bf16-reduce", "int8-gather", "hpz", "powersgd-4", "auto"):
            plan = autopar.plan(model, mesh, inputs, strategy=strategy, time_limit=20.0,
                                compression=allowed if allowed in (None, "auto")
                                else (allowed,))
            exact = exact or plan.step_time_s
            chosen = Counter(n.compression for n in plan.nodes if n.compression)
            print(f"| {strategy} | {allowed or 'none'} | {plan.step_time_s * 1e3:.1f} | "
                  f"{exact / plan.step_time_s:.2f}x | {plan.peak_memory_bytes / 2**30:.2f} | "
                  + (", ".join(f"{name} {count}" for name, count in chosen.most_common())
                     or "-") + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="30 steps on 2 ranks")
    args = parser.parse_args(argv)
    predicted(args.quick)
    print()
    ranks, steps = (2, 30) if args.quick else (4, 300)
    mesh = autopar.Mesh((ranks,), ("dp",), hardware="h100-ethernet", links=("ethernet",))
    model, _ = gpt.build(**SIZES)
    runs = {}
    for name, compression in (("exact", None), (COMPRESSION, (COMPRESSION,))):
        plan = autopar.plan(model, mesh, batch(0), strategy="data parallel",
                            compression=compression, time_limit=10.0)
        compressed = sum(n.compression == COMPRESSION for n in plan.nodes)
        print(f"{name}: {compressed} parameters compressed, predicted step "
              f"{plan.step_time_s * 1e3:.3f} ms on {mesh.describe()}")
        runs[name] = launch(train, ranks, plan.to_dict(), steps, timeout=1800.0)[0]
    _report(runs, steps, ranks)


def _report(runs: dict[str, dict], steps: int, ranks: int) -> None:
    exact, compressed = (runs[name]["losses"] for name in ("exact", COMPRESSION))
    print(f"\n## GPT (small), {steps} AdamW steps on {ranks} gloo ranks, loss per step")
    print(f"| step | exact | {COMPRESSION} | ratio |")
    print("|---|---|---|---|")
    for step in sorted({*range(0, steps, max(1, steps // 12)), steps - 1}):
        print(f"| {step} | {exact[step]:.4f} | {compressed[step]:.4f} | "
              f"{compressed[step] / exact[step]:.4f} |")
    final = {name: statistics.mean(run["losses"][-TAIL:]) for name, run in runs.items()}
    print(f"\nfinal loss (mean of the last {TAIL} steps): exact {final['exact']:.4f}, "
          f"{COMPRESSION} {final[COMPRESSION]:.4f}, ratio "
          f"{final[COMPRESSION] / final['exact']:.4f}")
    print(f"\n```\n{plot({'exact': exact, COMPRESSION: compressed})}\n```")
    measured, predicted = (runs[COMPRESSION][k] for k in ("measured", "predicted"))
    print(f"\nbytes of the last {COMPRESSION} step: measured "
          f"{sum(measured.values()):,.0f}, planned {sum(predicted.values()):,.0f}, "
          f"{'equal' if measured == predicted else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
