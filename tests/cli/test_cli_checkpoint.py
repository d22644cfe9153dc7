"""`autopar run --checkpoint-dir`: a run that loses a rank restarts by itself from its
latest checkpoint and ends where the uninterrupted run ends; with the device gone for good
it plans again for the processes left and still does (each `autopar run` launches real
gloo processes through click's runner)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from autopar.cli import main
from autopar.tools import checkpoint

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "tests" / "runtime" / "tripwire_model.py"
STEPS = 6


def _run(directory: Path, *extra: str) -> str:
    result = CliRunner().invoke(main, [
        "run", str(MODEL), "--nproc", "4", "--mesh", "2x2", "--steps", str(STEPS),
        "--lr", "5e-5", "--pipeline", "off", "--checkpoint-dir", str(directory),
        "--checkpoint-every", "1", *extra])
    assert result.exit_code == 0, result.output
    return result.output


def _final(directory: Path, steps: int = STEPS) -> dict[str, torch.Tensor]:
    from tests.runtime import tripwire_model

    model, _ = tripwire_model.build()
    optimizer = torch.optim.AdamW(model.parameters())
    info = checkpoint.load_full(checkpoint.latest(directory), model, optimizer)
    assert info.step == steps
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_a_lost_rank_resumes_from_the_last_checkpoint_and_ends_as_if_never_lost(tmp_path):
    _run(tmp_path / "whole")
    uninterrupted = _final(tmp_path / "whole")
    out = _run(tmp_path / "killed", "--set", "call=4", "--set", f"marker={tmp_path / 'died'}")
    assert "restart 1 of 3" in out and "on 4 processes" in out
    assert (tmp_path / "died").exists()
    killed = _final(tmp_path / "killed")
    assert all(torch.equal(killed[k], uninterrupted[k]) for k in uninterrupted)

    out = _run(tmp_path / "shrunk", "--set", "call=4", "--set", f"marker={tmp_path / 'gone'}",
               "--set", "lost=1", "--min-nproc", "2")
    assert "restart 2 of 3" in out and "on mesh 2 (dp=2" in out
    assert "on 2 processes" in out
    shrunk = _final(tmp_path / "shrunk")
    error = sum(float((shrunk[k] - uninterrupted[k]).norm()) ** 2 for k in uninterrupted)
    norm = sum(float(uninterrupted[k].norm()) ** 2 for k in uninterrupted)
    assert error ** 0.5 <= 1e-6 * norm ** 0.5


def test_a_torchrun_script_resumes_after_a_restart(tmp_path):
    """examples/train.py with --checkpoint-dir under `torchrun --max-restarts 1`: the rank
    that dies takes the run down, torchrun starts it again, and it goes on from its last
    checkpoint to the uninterrupted run's parameters."""
    import os
    import subprocess
    import sys

    def torchrun(directory: Path, *extra: str) -> str:
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               # gloo's rendezvous store must not outlive the first attempt's agent
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc_per_node", "2", "--max-restarts", "1",
             str(ROOT / "examples" / "train.py"), "--model-file", str(MODEL), "--mesh", "2",
             "--steps", "4", "--lr", "5e-5", "--checkpoint-dir", str(directory),
             "--checkpoint-every", "1", "--set", "world=2", *extra],
            capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    torchrun(tmp_path / "whole")
    out = torchrun(tmp_path / "killed", "--set", "call=3", "--set",
                   f"marker={tmp_path / 'died'}")
    assert (tmp_path / "died").exists() and "step   4/4" in out
    whole, killed = _final(tmp_path / "whole", 4), _final(tmp_path / "killed", 4)
    assert all(torch.equal(killed[k], whole[k]) for k in whole)
