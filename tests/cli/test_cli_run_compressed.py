"""`autopar run --verify` of plans that compress: the single-process model gets the same
rounding (int8 gathers, over one mesh axis or two), or checks the compiled gradient within
bfloat16's bound and steps with it (bf16-reduce), or steps with the compiled approximation
(PowerSGD), so that every other gradient and the loss are still checked to 1e-5 at every
step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import autopar
from autopar.cli import main
from autopar.tools.model_file import load_model_file

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp.py"
SIZES = ("hidden=512", "ffn=2048")
MESH = autopar.Mesh((2,), ("dp",), hardware="h100-ethernet", links=("ethernet",))
CASES = {  # compression: the hand strategy the plan is made with
    "bf16-reduce": "data parallel",
    "int8-gather": "fully sharded (ZeRO-3)",
    "powersgd-2": "data parallel",
}
STEPS = 12  # PowerSGD's warm-up (10 exact steps), then compressed ones


@pytest.mark.parametrize("compression", CASES)
def test_verify_applies_the_plans_rounding(compression, tmp_path):
    model, inputs = load_model_file(MLP, hidden=512, ffn=2048)
    plan = autopar.plan(model, MESH, inputs, strategy=CASES[compression],
                        compression=(compression,), time_limit=10.0)
    assert any(n.compression == compression for n in plan.nodes)
    plan.save(tmp_path / "plan.json")
    settings = [part for size in SIZES for part in ("--set", size)]
    result = CliRunner().invoke(main, [
        "run", str(MLP), "--mesh", "2", "--hardware", "h100-ethernet", "--steps", str(STEPS),
        "--verify", "--plan", str(tmp_path / "plan.json"), *settings])
    assert result.exit_code == 0, result.output
    out = result.stdout
    diffs = re.findall(r"^step +\d+/\d+ +loss \S+ +reference \S+ +loss diff (\S+)", out, re.M)
    assert len(diffs) == STEPS and all(float(d) <= 1e-5 for d in diffs), out
    assert "verification passed" in out
    rows = re.findall(r"^(\w+) +(\w+) +(forward|backward) +([0-9,]+) +([0-9,]+) +(\w+)$",
                      out, re.M)
    if not compression.startswith("powersgd"):  # PowerSGD's warm-up moves more
        assert rows and all(match == "yes" for *_, match in rows), out


@pytest.mark.parametrize(("allowed", "chosen"), [
    (("hpz",), "hpz"), (("int8-gather", "hpz"), "int8-gather+hpz"),
    ("auto", "bf16-reduce+int8-gather+hpz")])
def test_verify_over_two_axes_checks_every_gradient(allowed, chosen, tmp_path):
    # hpz is exact: nothing rounded or taken from the compiled model. int8 gathers over
    # (node, gpu) round twice, once per axis: the reference rounds as they do. With all
    # three (ZeRO++'s), the bf16 gradients are checked within their bound, then taken.
    model, inputs = load_model_file(MLP, hidden=512, ffn=2048)
    mesh = autopar.Mesh((2, 2), ("node", "gpu"), hardware="h100-ethernet",
                        links=("ethernet", "nvlink"))
    plan = autopar.plan(model, mesh, inputs, strategy="fully sharded (ZeRO-3)",
                        compression=allowed, time_limit=10.0)
    assert any(n.compression == chosen for n in plan.nodes)
    plan.save(tmp_path / "plan.json")
    settings = [part for size in SIZES for part in ("--set", size)]
    result = CliRunner().invoke(main, [
        "run", str(MLP), "--mesh", "2x2", "--axis-names", "node,gpu", "--hardware",
        "h100-ethernet", "--steps", "3", "--verify", "--plan", str(tmp_path / "plan.json"),
        *settings])
    assert result.exit_code == 0, result.output
    diffs = re.findall(r"^step +\d+/\d+ +loss \S+ +reference \S+ +loss diff (\S+)",
                       result.stdout, re.M)
    assert len(diffs) == 3 and all(float(d) <= 1e-5 for d in diffs), result.stdout
    rows = re.findall(r"^(\w+) +(\w+) +(forward|backward) +([0-9,]+) +([0-9,]+) +(\w+)$",
                      result.stdout, re.M)
    assert rows and all(match == "yes" for *_, match in rows), result.stdout
