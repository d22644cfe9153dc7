"""Benchmarks do not rot: every script in benchmarks/ runs with `--quick` (the same code on
the smallest sizes) as a fresh process from the repository root, exits with status 0 and
prints its table. 2 to 3.5 minutes on 2 shared cores, the ones that start gloo ranks
(checkpoint, memory fidelity, overhead, pipeline bubble, stage memory) taking most of it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300.0  # seconds per script; each takes well under a minute on an idle machine


def run_quick(script: str, *extra: str) -> str:
    """`python benchmarks/<script> --quick`; its stdout, after checking its exit status."""
    done = subprocess.run([sys.executable, f"benchmarks/{script}", "--quick", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, (
        f"{script} --quick exited with {done.returncode}\n{done.stdout[-4000:]}\n"
        f"{done.stderr[-4000:]}")
    return done.stdout


def has_line(pattern: str, text: str) -> bool:
    return re.search(pattern, text, re.MULTILINE) is not None


def test_checkpoint() -> None:
    out = run_quick("checkpoint.py")
    assert "AdamW, on 4 gloo processes; slowest rank of 1 saves" in out
    assert has_line(r"^layout\s+state MiB\s+on disk MiB\s+disk/state\s+sync s", out)
    number = r"\s+\d+\.\d+"
    for layout in ("2x2 sharded", "data parallel"):
        assert has_line(rf"^{layout}{number * 7}$", out), layout


def test_fidelity() -> None:
    out = run_quick("fidelity.py")
    assert "profiled mesh 2-dp-cpu" in out
    assert has_line(r"^\| mlp \| 2 \| solver \| \d+\.\d\d \| \d+\.\d\d \(±\d+%\) \| "
                    r"\d+\.\d\d \| \d+\.\d \| \d+\.\d \| \d+\.\d\d \|$", out)
    assert "step time: median |pred/meas - 1|" in out and "over 1 cases" in out


def test_planning_time() -> None:
    out = run_quick("planning_time.py")
    assert "| case | planned in (s) | step (s) | MFU | GiB | layout | gap |" in out
    number = r"\d+\.\d+"
    assert has_line(rf"^\| tiny \| {number} of 5 \| {number} \| {number} \|", out)
    assert has_line(rf"^\| tiny x2 \| {number} of 10 \| .* step ratio {number}$", out)


def test_published() -> None:
    out = run_quick("published.py")
    assert "## 8b-h100: Llama 3.1 8B" in out
    assert has_line(r"^case\s+tok/s/GPU\s+pred\s+ratio\s+hidden\s+GiB\s+pred\s+ratio\s+MFU\s+"
                    r"pred\s+autopar$", out)
    assert has_line(r"^8b-h100\s+5,762\s+[\d,]+\s+\d\.\d{3}\s+[\d,]+\s+82\.4\s+\d+\.\d\*?\s+"
                    r"\d\.\d{3}\s+\d+\.\d%\+\s+\d+\.\d%\s+\d+\.\d%$", out)


def test_published_megatron() -> None:
    out = run_quick("published_megatron.py")
    assert "## GPT 1.7B: 24 layers" in out
    assert has_line(r"^case\s+GPUs\s+TFLOP/s\s+pred\s+ratio\s+MFU\s+pred\s+GiB\s+fits\s+solver$",
                    out)
    assert has_line(r"^1\.7B\s+48\s+408\.8\s+\d+\.\d\s+\d\.\d{3}\s+41%\s+\d+\.\d%\s+\d+\.\d\s+"
                    r"yes\s+-$", out)


def test_hand_strategies() -> None:
    out = run_quick("hand_strategies.py")
    assert "Predicted step time (ms): solver vs hand strategies" in out
    for mesh in ("8", "2x4"):
        for hardware in ("h100-sxm", "a100-sxm"):
            # The solver's plan, then the hand strategies': the solver is never worse than
            # the best that fits (the script exits with 1 otherwise).
            assert has_line(rf"│ mlp\s+│ {mesh}\s+│ {hardware} │\s+[\d,.]+ │", out), (mesh,
                                                                                   hardware)
    ratios = [float(r) for r in re.findall(r"│\s+(\d\.\d{6}) │", out)]
    assert len(ratios) == 4 and all(r <= 1.0 for r in ratios), ratios  # solver / best fitting


def test_iopddl(tmp_path: Path) -> None:
    out = run_quick("iopddl.py", "--logs", str(tmp_path))
    assert has_line(r"^inst\s+run\s+cost\s+fits\s+points\s+status\s+gap\s+time\s+limit$", out)
    # Instance G (tests/solver/data), one run with a 5 s limit, a feasible answer (whether
    # the process ended within the limit depends on the machine's load: a table cell here).
    assert has_line(r"^G\s+0\s+\d+\s+yes\s+\d\.\d{4}\s+(feasible|optimal)\s+.*\s+5s$", out)
    assert "average points over 1 instances" in out and has_line(r"runs past their limit: \d", out)
    assert (tmp_path / "G-0.log").read_text()


def test_solver_family(tmp_path: Path) -> None:
    out = run_quick("solver_family.py", "--logs", str(tmp_path))
    assert has_line(r"^instance\s+nodes\s+strategies\s+limit\s+cost\s+best\s+points\s+"
                    r"status\s+time\s+limit$", out)
    # Two generated instances, 4 s each; every answer fits, and scores at most 1 point.
    for name, nodes in (("0-03-462", 462), ("0-06-1066", 1066)):
        assert has_line(rf"^{name}\s+{nodes}\s+\d+\s+\S+\s+\d+\s+\d+\*?\s+[01]\.\d{{4}}\s+"
                        r"(feasible|optimal)\s+\d+\.\ds\s+4s$", out), name
        assert (tmp_path / f"{name}.log").read_text()
    assert "average points over 2 instances" in out and has_line(r"runs past their limit: 0", out)


def test_large_models() -> None:
    out = run_quick("large_models.py")
    assert "## tiny Llama shape" in out and "predicted step" in out
    assert has_line(r"^peak memory \d+\.\d+ GiB of 74\.00 GiB", out)  # 80 GiB less the reserve
    assert has_line(r"^layer 0 parameters \(stored, kept gathered\):", out)
    assert has_line(r"^CP x TP x FSDP \(.*\): step \d+\.\d+ s", out)


def test_serving() -> None:
    out = run_quick("serving.py")
    assert "## tiny Llama shape" in out
    assert has_line(r"^predicted \d+\.\d ms per output token \(\d+ tokens/s\), ", out)
    assert has_line(r"^peak memory \d+\.\d of 74\.0 GiB; KV cache \d+\.\d\d GiB per device, "
                    r"1024 tokens$", out)
    assert has_line(r"^predicted time to first token \(64-token prompts\)", out)
    for rule in ("Megatron tensor parallel", "Megatron 3D"):
        assert has_line(rf"^{rule}\s+\d+\.\d\s+\d+\.\d\s+yes\s+\d\.\d{{3}} \(rule of thumb\)$",
                        out), rule
    assert "### throughput, from batch 4 (context 256)" in out
    for name in ("planned", r"Megatron 3D \(rule of thumb\)"):
        assert has_line(rf"^{name}\s+\d+\s+[\d,]+\s+\d+\.\d\s+\d+\.\d\s+\d+\.\d$", out), name


def test_uneven() -> None:
    out = run_quick("uneven.py")
    assert "## tiny Llama shape on 8x8 h100-sxm" in out
    for vocab in (1024, 1025):
        assert has_line(rf"^\| {vocab} \| \d+\.\d ms \| \d+\.\d\d GiB \| ", out), vocab
    ratio = re.search(r"^odd over even: (\d+\.\d{4})$", out, re.MULTILINE)
    assert ratio and float(ratio.group(1)) <= 1.01


def test_memory_fidelity() -> None:
    out = run_quick("memory_fidelity.py")
    assert "mesh 2x2 (dp, tp), 4 gloo ranks, AdamW; 2 cases" in out
    for fraction in ("1", "0.5"):
        assert f"mlp at {fraction} x replicated peak" in out, fraction
    assert has_line(r"^\s+kind\s+predicted\s+measured\s+ratio$", out)
    # Parameters and optimizer states: measured as predicted, to the byte.
    assert len(re.findall(r"^\s+parameters\s+(\d+)\s+\1\s+1\.000$", out, re.MULTILINE)) == 2
    assert len(re.findall(r"^\s+optimizer\s+(\d+)\s+\1\s+1\.000$", out, re.MULTILINE)) == 2


def test_stage_memory() -> None:
    out = run_quick("stage_memory.py")
    assert "on a 2x2 (pp, tp) mesh of gloo processes" in out
    assert has_line(r"^\| schedule \| micro-batches \| pp rank \| in flight \| predicted MiB", out)
    # One row per pipeline rank: the stage's micro-batches in flight (1F1B: 2, then 1).
    for rank, held in ((0, 2), (1, 1)):
        assert has_line(rf"^\| 1F1B \| 4 \| {rank} \| {held} \| \d+\.\d+ \| \d+\.\d+ \| "
                        r"\d\.\d\d \|$", out), rank
    assert has_line(r"^per stage: median \|pred/meas - 1\| \d+\.\d%, worst \d+\.\d%", out)


def test_overhead() -> None:
    out = run_quick("overhead.py")
    assert "autopar overhead: MLP hidden 32, ffn 128, batch 8" in out
    assert "autopar ms/step" in out
    for row in ("1 device vs eager", "data parallel vs DDP", "data parallel vs DDP + loss sum",
                "Megatron vs torch TP"):
        # The times are noise at this size: only that every row was measured and printed.
        assert has_line(rf"│ {re.escape(row)}\s+│\s+\d+\.\d+ │\s+\d+\.\d+ │", out), row


def test_pipeline_bubble() -> None:
    out = run_quick("pipeline_bubble.py")
    assert "on pp=2 gloo processes; median of 1 steps after 1" in out
    assert has_line(r"^schedule\s+m\s+predicted ms\s+measured ms\s+meas/pred", out)
    for m in (2, 4):
        assert has_line(rf"^GPipe\s+{m}(\s+\d+\.\d+){{5}}\s+\d+\.\d+%$", out), m


def test_scale() -> None:
    out = run_quick("scale.py")
    assert "Llama-3-8B shape (batch 8) on 2x2" in out
    assert has_line(r"^layers decisions\s+capture\s+annotate", out)
    # Two layers; the plan made block by block (--check) is the same plan.
    assert has_line(r"^\s+2\s+\d+(\s+\d+\.\d+){8}\s+\d+\.\d+ \w+\s+same \(", out)


# Scripts: what runs as one (the benchmarks' shared helpers, such as case_options.py, don't).
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")
                 if 'if __name__ == "__main__":' in p.read_text())


def test_the_benchmarks_are_found() -> None:
    assert {"published.py", "published_megatron.py", "planning_time.py"} <= set(SCRIPTS)
    assert "case_options.py" not in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_is_tested_and_documents_quick(script: str) -> None:
    assert f"def test_{script.removesuffix('.py')}(" in Path(__file__).read_text(), script
    doc = (ROOT / "benchmarks" / script).read_text().split('"""')[1]
    assert f"benchmarks/{script} --quick" in doc, f"{script}: no --quick in its usage"


def test_compression() -> None:
    out = run_quick("compression.py")
    row = r"^\| {} \| {} \| \d+\.\d \| \d+\.\d\dx \| \d+\.\d\d \| {} \|$"
    assert has_line(row.format("data parallel", "none", "-"), out)
    assert has_line(row.format(r"fully sharded \(ZeRO-3\)", "auto",
                               r"bf16-reduce\+int8-gather\+hpz \d+.*"), out)
    assert has_line(r"^exact: 0 parameters compressed", out)
    assert has_line(r"^powersgd-4: [1-9]\d* parameters compressed", out)
    assert "## GPT (small), 30 AdamW steps on 2 gloo ranks, loss per step" in out
    assert has_line(r"^\| 29 \| \d+\.\d{4} \| \d+\.\d{4} \| \d\.\d{4} \|$", out)
    assert has_line(r"^final loss \(mean of the last 10 steps\): exact \d+\.\d{4}, "
                    r"powersgd-4 \d+\.\d{4}, ratio \d\.\d{4}$", out)
    assert has_line(r"^bytes of the last powersgd-4 step: measured [\d,]+, planned [\d,]+, "
                    r"equal$", out)
