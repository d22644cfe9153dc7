"""The `autopar` command line, through click's runner (same process, real arguments)."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from autopar.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "solver" / "data" / "iopddl-example.json"


def test_plan_prints_the_summary_and_writes_json(tmp_path):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(main, [
        "plan", str(ROOT / "examples" / "mlp.py"), "--mesh", "2x2", "--axis-names", "dp,tp",
        "--hardware", "a100-sxm", "--set", "batch=16", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "predicted step time" in result.output and "[stage] solve" in result.output
    assert json.loads(out.read_text())["mesh"]["axis_names"] == ["dp", "tp"]
    # On by default: each hand strategy's solve is announced, then compared in the summary.
    assert "[stage] hand strategy: data parallel" in result.output
    for text in ("Compared with hand strategies", "data parallel", "fully sharded (ZeRO-3)",
                 "Megatron tensor parallel", "data x tensor parallel", "scaling efficiency",
                 "peak memory / capacity", "AR dp"):
        assert text in result.output, text
    assert len(json.loads(out.read_text())["hand_strategies"]) == 9  # eight, and one device


def test_plan_can_skip_the_hand_strategies_and_write_the_report(tmp_path):
    report = tmp_path / "plan.html"
    result = CliRunner().invoke(main, [
        "plan", str(ROOT / "examples" / "mlp.py"), "--mesh", "2", "--no-hand-strategies",
        "--report", str(report)])
    assert result.exit_code == 0, result.output
    assert "predicted step time" in result.output
    assert "Compared with hand strategies" not in result.output
    assert f"report written to {report}" in result.output
    assert report.read_text().startswith("<!DOCTYPE html>")


def test_plan_reports_bad_input_without_a_traceback(tmp_path):
    result = CliRunner().invoke(main, ["plan", str(ROOT / "examples" / "mlp.py"),
                                       "--hardware", "nonexistent"])
    assert result.exit_code != 0
    assert "unknown hardware" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["plan", str(tmp_path / "missing.py")])
    assert result.exit_code != 0 and "not found" in result.output


def test_plan_cuts_a_mixed_mesh_by_the_shares_given():
    result = CliRunner().invoke(main, [
        "plan", str(ROOT / "examples" / "mlp.py"), "--mesh", "4", "--axis-names", "dp",
        "--hardware", "h100-sxm,h100-sxm,a100-sxm,a100-sxm", "--shares", "3:3:1:1",
        "--set", "batch=16", "--no-hand-strategies", "--time-limit", "5"])
    assert result.exit_code == 0, result.output
    assert "dp pieces 3:3:1:1" in " ".join(result.output.split())  # the title may wrap
    result = CliRunner().invoke(main, ["plan", str(ROOT / "examples" / "mlp.py"), "--mesh",
                                       "2x2", "--shares", "3:1"])
    assert result.exit_code != 0 and "one entry per mesh axis (2)" in result.output


def test_solve_prints_cost_then_choices_last_within_its_timeout():
    """A real process (the command leaves with os._exit once its answer is out): the
    whole process, interpreter start-up included, ends within the timeout."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "autopar.cli", "solve", str(EXAMPLE),
                           "--timeout", "8", "--progress"], capture_output=True, text=True)
    assert time.monotonic() - start <= 8.0
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    choices = json.loads(lines[-1])
    assert len(choices) == 5 and all(isinstance(c, int) for c in choices)
    assert re.search(r"\d", lines[-2])  # the cost, on the line before last
    assert any("objective" in line for line in lines[:-2])


def test_run_prints_the_modelled_step_in_the_summary_units(tmp_path):
    """`autopar run` states the modelled step and peak memory as `autopar plan` does (ms and
    KiB/MiB/GiB, autopar.report.units), not in raw bytes."""
    from autopar.present.report.units import ms, size
    from autopar.values.plan import Plan

    saved = tmp_path / "plan.json"
    planned = CliRunner().invoke(main, [
        "plan", str(ROOT / "examples" / "mlp.py"), "--mesh", "1", "--hardware", "cpu",
        "--no-hand-strategies", "--out", str(saved)])
    assert planned.exit_code == 0, planned.output
    plan = Plan.load(saved)
    step, peak = ms(plan.step_time_s), size(plan.peak_memory_bytes)
    assert "predicted step time" in planned.output and step in planned.output
    assert f"{peak} of" in planned.output
    ran = CliRunner().invoke(main, ["run", str(ROOT / "examples" / "mlp.py"), "--mesh", "1",
                                    "--nproc", "1", "--steps", "1", "--plan", str(saved)])
    assert ran.exit_code == 0, ran.output
    assert f"modelled step {step}, peak memory {peak} per device" in ran.output, ran.output


FLIP = '''
import torch
from torch import nn


class Flip(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return torch.flip(self.fc(x), dims=(1,)).pow(2).mean()


def build():
    torch.manual_seed(0)
    return Flip(), (torch.randn(8, 16),)
'''


def test_plan_shows_each_warning_once_as_a_line(tmp_path, monkeypatch):
    """Every solve (the plan's, each hand strategy's) finds the strategies and warns again;
    the command shows each warning once, as a "warning:" line, not as Python's warning
    lines with a file path."""
    import sys
    import warnings

    import torch

    from autopar import rules

    lookup = rules.lookup
    monkeypatch.setattr(rules, "lookup", lambda target: None
                        if target is torch.ops.aten.flip.default else lookup(target))
    # Python's own display of warnings (pytest records them otherwise).
    monkeypatch.setattr(warnings, "showwarning", lambda message, category, filename, lineno,
                        file=None, line=None: sys.stderr.write(
                            warnings.formatwarning(message, category, filename, lineno, line)))
    model_file = tmp_path / "flip.py"
    model_file.write_text(FLIP)
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        result = CliRunner().invoke(main, ["plan", str(model_file), "--mesh", "2x2",
                                           "--hardware", "cpu", "--time-limit", "5"])
    assert result.exit_code == 0, result.output
    assert result.output.count("no sharding rule for aten.flip.default") == 1, result.output
    assert "warning: no sharding rule for aten.flip.default" in result.output
    assert "UserWarning" not in result.output and ".py:" not in result.output
