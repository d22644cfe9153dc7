"""`autopar run --measure`: after training, every rank measures the step and the parent
prints the plan's predictions against the measurements; bad step counts are refused
before anything is planned or any rank starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from autopar.cli import main
from autopar.values.measurement import GROUPS

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp.py"
_MS = r"([0-9.,]+) ms"


def _cells(out: str, quantity: str) -> list[str]:
    """The cells of the comparison table's row that starts with `quantity`."""
    table = out[out.index("Predicted against measured"):]
    line = next(line for line in table.splitlines()
                if re.match(rf"\W*{re.escape(quantity)}\s*│", line))
    return [cell.strip() for cell in line.split("│")[1:-1]]


def _ratio_checked(cells: list[str]) -> None:
    """The ratio column is the measured value over the predicted one, or "-" for none."""
    predicted, measured, ratio = cells[1:4]
    shown = float(predicted.split()[0].replace(",", ""))
    if ratio == "-":
        assert shown == 0, cells
        return
    if shown == 0:  # a prediction below the printed precision: its ratio can't be checked
        return
    assert measured.split()[-1] == predicted.split()[-1], cells  # the same unit
    got = float(measured.split()[0].replace(",", "")) / shown
    assert float(ratio.rstrip("x")) == pytest.approx(got, rel=0.05, abs=0.01), cells


def test_run_measure_prints_predicted_against_measured():
    result = CliRunner().invoke(main, ["run", str(MLP), "--nproc", "2", "--mesh", "2",
                                       "--measure", "--steps", "3"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "training 3 steps" in out and "then measuring 3 more on every rank" in out
    assert len(re.findall(r"^step +\d/3 +loss", out, re.M)) == 3  # it trained first
    modelled = float(re.search(r"modelled step " + _MS, out).group(1))
    assert "Predicted against measured (2 ranks, 3 timed steps after 2 warm-up, on cpu)" \
        in out
    step = _cells(out, "step time")
    assert step[1] == f"{modelled:.3f} ms"  # the plan's step, as announced
    assert float(step[2].split()[0]) > 0 and "median of 3 steps" in step[4]
    for quantity in ("step time", *GROUPS, "peak memory, rank 0", "peak memory, rank 1"):
        _ratio_checked(_cells(out, quantity))
    assert float(_cells(out, "matmul")[2].split()[0]) > 0
    assert "Traceback" not in result.output


def test_one_process_is_measured_in_this_one():
    result = CliRunner().invoke(main, ["run", str(MLP), "--nproc", "1", "--mesh", "1",
                                       "--measure", "--steps", "2"])
    assert result.exit_code == 0, result.output
    assert "(1 rank, 2 timed steps after 2 warm-up, on cpu)" in result.stdout
    _ratio_checked(_cells(result.stdout, "peak memory, rank 0"))
    assert "peak memory, rank 1" not in result.stdout


@pytest.mark.parametrize("steps", ["0", "-2"])
def test_measuring_no_step_is_refused_before_anything_runs(steps):
    result = CliRunner().invoke(main, ["run", str(MLP), "--nproc", "2", "--mesh", "2",
                                       "--measure", "--steps", steps])
    assert result.exit_code == 1, result.output
    out = result.output
    assert "--measure has no step to time" in out and f"got: --steps {steps}" in out
    assert "expected:" in out and "fix: e.g. --measure --steps 5" in out
    # Refused first: nothing planned, no rank started.
    assert "modelled step" not in out and "training" not in out
    assert "Traceback" not in out
