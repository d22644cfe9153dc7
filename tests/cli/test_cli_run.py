"""`autopar run`: training a model file on local gloo processes, through click's runner
(same process; the ranks are real processes started by `autopar.launch`)."""

import re
from pathlib import Path

from click.testing import CliRunner

import autopar
from autopar.cli import main
from autopar.tools.model_file import load_model_file

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp.py"

# A model whose compiled and plain copies draw different dropout masks: never verifiable.
NOISY = '''
import torch
from torch import nn


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x)).pow(2).mean()


def build():
    return Noisy(), (torch.randn(8, 16),)
'''


def replicated_peak() -> float:
    """Peak memory per device of the MLP kept whole: a budget below it forces sharding."""
    model, inputs = load_model_file(MLP)
    return autopar.plan(model, autopar.Mesh((1,), ("x",), hardware="cpu"),
                        inputs).peak_memory_bytes


def test_run_trains_sharded_matches_the_plan_and_verifies():
    budget = 0.6 * replicated_peak()
    result = CliRunner().invoke(main, [
        "run", str(MLP), "--nproc", "2", "--mesh", "2", "--steps", "3", "--verify",
        "--memory-budget", str(budget)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    steps = re.findall(r"^step +(\d)/3 +loss ([0-9.]+) +reference ([0-9.]+) +loss diff (\S+)"
                       r" +grad diff (\S+)", out, re.M)
    assert [int(s[0]) for s in steps] == [1, 2, 3], out
    assert all(float(diff) <= 1e-5 and float(grad) <= 1e-5 for *_, diff, grad in steps), out
    assert float(steps[-1][1]) < float(steps[0][1]), out  # it trains
    rows = re.findall(r"^(\w+) +(\w+) +(forward|backward) +([0-9,]+) +([0-9,]+) +(\w+)$",
                      out, re.M)
    assert rows, out  # the budget made the plan split something and communicate
    assert all(match == "yes" and got == want for *_, got, want, match in rows), out
    assert "verification passed" in out


def test_nproc_other_than_the_mesh_size_is_a_clear_error():
    result = CliRunner().invoke(main, ["run", str(MLP), "--nproc", "3", "--mesh", "2x2"])
    assert result.exit_code == 2
    assert "--nproc" in result.output and "--nproc 4" in result.output
    assert "Traceback" not in result.output


def test_a_model_that_cannot_match_fails_verification(tmp_path):
    model_file = tmp_path / "noisy_model.py"
    model_file.write_text(NOISY)
    result = CliRunner().invoke(main, ["run", str(model_file), "--nproc", "1", "--mesh", "1",
                                       "--steps", "2", "--verify"])
    assert result.exit_code == 1, result.output
    assert "verification failed" in result.output and "gradient of fc.weight" in result.output
    assert "Traceback" not in result.output
