"""Bad input gets an AutoparError that says what was expected, what was given and the fix."""

import json

import pytest
import torch
from torch import nn

import autopar
from examples import mlp


def assert_helpful(error: autopar.AutoparError) -> None:
    text = str(error)
    assert "expected:" in text and "got:" in text and "fix:" in text, text


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # control flow on a tensor value: torch.export can't capture it
            return self.linear(x).sum()
        return x.sum()


def test_uncapturable_model():
    with pytest.raises(autopar.CaptureError) as info:
        autopar.plan(DataDependent(), autopar.Mesh((2,), ("dp",)), (torch.randn(2, 4),))
    assert "fix:" in str(info.value)


def test_mesh_whose_names_do_not_match_its_shape():
    with pytest.raises(autopar.MeshError) as info:
        autopar.Mesh((2, 4), ("dp",))
    assert_helpful(info.value)


def test_unknown_hardware():
    with pytest.raises(autopar.HardwareError) as info:
        autopar.Mesh((2,), ("dp",), hardware="h200-nvl")
    assert_helpful(info.value)


def test_dim_that_cannot_split_on_the_axis():
    # 3 rows in 4 (DTensor's chunks: 1, 1, 1, 0) would leave a device an empty piece.
    model, inputs = mlp.build(batch=8, hidden=6, ffn=3)
    mesh = autopar.Mesh((4,), ("tp",))
    with pytest.raises(autopar.ShardingError) as info:
        autopar.plan(model, mesh, inputs, constraints={"fc1.weight": "S(0)"})
    assert "size 3" in str(info.value) and "'tp'" in str(info.value)
    assert "empty" in str(info.value)
    assert_helpful(info.value)


def test_pin_of_an_unknown_tensor():
    model, inputs = mlp.build()
    with pytest.raises(autopar.ShardingError, match="no such tensor"):
        autopar.plan(model, autopar.Mesh((2,), ("tp",)), inputs, constraints={"nope": "R"})


def test_memory_budget_nothing_fits_reports_the_least_memory_needed():
    model, inputs = mlp.build(batch=8, hidden=64, ffn=256)
    mesh = autopar.Mesh((2,), ("dp",))
    with pytest.raises(autopar.InfeasiblePlanError) as info:
        autopar.plan(model, mesh, inputs, memory_budget=1000)
    assert_helpful(info.value)
    least = info.value.min_bytes
    assert 1000 < least
    # The least memory is achievable: planning with exactly that budget succeeds.
    plan = autopar.plan(model, mesh, inputs, memory_budget=least)
    assert plan.peak_memory_bytes <= least


def test_corrupt_and_newer_plan_files(tmp_path):
    model, inputs = mlp.build()
    plan = autopar.plan(model, autopar.Mesh((2,), ("dp",)), inputs)
    path = tmp_path / "plan.json"
    plan.save(path)
    data = json.loads(path.read_text())
    (tmp_path / "newer.json").write_text(json.dumps({**data, "version": data["version"] + 1}))
    with pytest.raises(autopar.PlanFormatError, match="newer") as info:
        autopar.Plan.load(tmp_path / "newer.json")
    assert_helpful(info.value)
    (tmp_path / "corrupt.json").write_text(path.read_text()[:200])
    with pytest.raises(autopar.PlanFormatError):
        autopar.Plan.load(tmp_path / "corrupt.json")
    del data["nodes"]
    (tmp_path / "missing.json").write_text(json.dumps(data))
    with pytest.raises(autopar.PlanFormatError, match="corrupt"):
        autopar.Plan.load(tmp_path / "missing.json")


def test_model_file_without_build(tmp_path):
    from autopar.tools.model_file import load_model_file

    path = tmp_path / "model.py"
    path.write_text("x = 1\n")
    with pytest.raises(autopar.ModelFileError, match="build"):
        load_model_file(path)


def test_model_file_that_fails_to_import(tmp_path):
    from autopar.tools.model_file import load_model_file

    path = tmp_path / "broken.py"
    path.write_text("import not_a_module_anywhere\n")
    with pytest.raises(autopar.ModelFileError, match="importing") as info:
        load_model_file(path)
    assert_helpful(info.value)


def test_model_file_inside_a_package_imports_its_siblings():
    from pathlib import Path

    from autopar.tools.model_file import load_model_file

    gpt_file = Path(__file__).resolve().parents[1] / "examples" / "gpt.py"
    model, inputs = load_model_file(gpt_file, layers=1)
    assert type(model).__name__ == "GPT" and len(inputs) == 2
