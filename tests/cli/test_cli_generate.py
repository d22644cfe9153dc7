"""`autopar generate`: decoding on local ranks, verified against transformers, and the errors
it raises before any rank starts."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from autopar.cli import main

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "causal_lm.py")


def test_generate_on_two_ranks_matches_transformers():
    result = CliRunner().invoke(main, ["generate", EXAMPLE, "--mesh", "2", "--verify",
                                       "--max-new-tokens", "12"])
    assert result.exit_code == 0, result.output
    assert "generated 4 x 12 tokens" in result.output and "output tokens/s" in result.output
    assert "time to first token" in result.output and "per output token" in result.output
    assert "predicted" in result.output and "measured" in result.output
    assert "verify: identical to transformers' generate" in result.output


def test_generate_refuses_a_cache_too_short_before_any_rank_starts():
    result = CliRunner().invoke(main, ["generate", EXAMPLE, "--mesh", "2", "--max-len", "20",
                                       "--max-new-tokens", "8"])
    assert result.exit_code != 0
    assert "need 24 cache positions" in result.output and "--max-len" in result.output
    assert "Traceback" not in result.output


def test_generate_refuses_a_model_file_without_a_prompt(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("import torch\n"
                    "def build():\n"
                    "    return torch.nn.Linear(2, 2), (torch.randn(2, 2),)\n")
    result = CliRunner().invoke(main, ["generate", str(path), "--mesh", "1"])
    assert result.exit_code != 0 and "prompt_ids" in result.output
