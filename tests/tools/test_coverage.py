"""`autopar.check` and `autopar check`: ops of a model, their rule family and FLOP source."""

import operator
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from autopar import CaptureError
from autopar.cli import main
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.tools.coverage import DATA_MOVEMENT, FORMULA, NO_RULE, check
from autopar.values.specs import FLOPS
from examples.gpt import build

ROOT = Path(__file__).resolve().parents[2]
GPT_CONFIG = {"vocab": 64, "seq": 8, "hidden": 32, "heads": 2, "layers": 2, "batch": 2}


class Bessel(nn.Module):
    """A linear layer then an op no rule covers (aten.special_bessel_j0)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.bessel_j0(self.fc(x))


@pytest.fixture(scope="module")
def gpt():
    model, inputs = build(**GPT_CONFIG)
    return model, inputs, check(model, inputs)


def test_gpt_ops_all_have_a_rule(gpt):
    model, inputs, report = gpt
    # Counted again from a fresh capture: every op node but getitem, each once.
    graph = annotate(capture(model, inputs)).graph
    ops = [n for n in graph.nodes
           if n.op == "call_function" and n.target is not operator.getitem]
    assert sum(row.count for row in report.rows) == len(ops)
    assert [row.op for row in report.rows] == list(dict.fromkeys(str(n.target) for n in ops))
    assert sum(row.flops for row in report.rows) == sum(n.meta[FLOPS] for n in ops)
    assert report.unruled == ()
    assert report.ruled_share_by_count == 1.0 and report.ruled_share_by_flops == 1.0

    rows = {row.op: row for row in report.rows}
    linear = rows["aten.linear.default"]
    # Per layer qkv, proj, fc, proj; then the LM head: 2 * out * in FLOPs per token (+ bias).
    layers, h, v = GPT_CONFIG["layers"], GPT_CONFIG["hidden"], GPT_CONFIG["vocab"]
    tokens = GPT_CONFIG["batch"] * GPT_CONFIG["seq"]
    shapes = ((h, 3 * h), (h, h), (h, 4 * h), (4 * h, h))  # (in, out) of each linear
    per_layer = sum(out * (2 * inp + 1) for inp, out in shapes)
    assert linear.count == 4 * layers + 1
    assert linear.flops == tokens * (layers * per_layer + v * 2 * h)
    assert (linear.family, linear.flop_source) == ("matmul", FORMULA)
    assert rows["aten.scaled_dot_product_attention.default"].count == layers
    assert rows["aten.embedding.default"].flop_source == DATA_MOVEMENT
    assert rows["aten.layer_norm.default"].flop_source == "estimate: 8 per element"
    assert rows["aten.add.Tensor"].family == "pointwise"


def test_an_op_without_a_rule_is_replicated_with_an_estimate():
    x = torch.randn(4, 8)
    report = check(Bessel(), (x,))
    assert [row.op for row in report.rows] == ["aten.linear.default",
                                               "aten.special_bessel_j0.default"]
    linear, bessel = report.rows
    assert report.unruled == (bessel,)
    assert (bessel.family, bessel.flop_source) == (NO_RULE, "estimate: 1 per element")
    assert bessel.flops == 4 * 16  # one per element of its (4, 16) input and output
    assert linear.flops == 4 * 16 * (2 * 8 + 1)
    assert report.ruled_share_by_count == 0.5
    assert report.ruled_share_by_flops == pytest.approx(linear.flops / (linear.flops + 64))
    assert NO_RULE in report.table() and "50.0%" in report.table()


def test_cli_prints_the_table_and_shares():
    result = CliRunner().invoke(main, ["check", str(ROOT / "examples" / "gpt.py"),
                                       "--set", "layers=1", "--set", "hidden=32"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if line.startswith("op "))
    for column in ("nodes", "rule family", "FLOP source", "forward FLOPs"):
        assert column in header
    linear = next(line for line in lines if line.startswith("aten.linear.default"))
    assert linear.split()[1:3] == ["5", "matmul"]  # qkv, proj, fc, proj, LM head
    assert "with a rule: " in result.output and "(100.0%)" in result.output


def test_cli_reports_a_model_export_cannot_capture(tmp_path):
    path = tmp_path / "branchy_model.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Branchy(nn.Module):
            def forward(self, x):
                if x.sum() > 0:  # depends on the values: torch.export cannot trace it
                    return x * 2
                return x

        def build():
            return Branchy(), (torch.randn(4, 4),)
    """))
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code != 0
    assert "could not capture Branchy" in result.output
    assert "fix: make the control flow and the sizes independent of tensor values" in result.output
    assert "Traceback" not in result.output


def test_check_raises_capture_error():
    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(CaptureError, match="could not capture Branchy"):
        check(Branchy(), (torch.randn(4, 4),))
