"""The `autopar` command line, through click's runner (same process, real arguments)."""

import json
import re
from pathlib import Path

from click.testing import CliRunner

from autopar.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT.parent / "shared" / "benchmarks" / "iopddl" / "example.json"


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
    assert len(json.loads(out.read_text())["hand_strategies"]) == 7  # six, and one device


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


def test_solve_prints_cost_then_choices_last():
    result = CliRunner().invoke(main, ["solve", str(EXAMPLE), "--timeout", "10"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    choices = json.loads(lines[-1])
    assert len(choices) == 5 and all(isinstance(c, int) for c in choices)
    assert re.search(r"\d", lines[-2])  # the cost, on the line before last
