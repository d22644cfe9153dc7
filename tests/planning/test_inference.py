"""Forward-only plans (`training=False`): what they cost and hold, and the errors around them.

The equivalence of their programs on gloo is `tests/runtime/test_inference_equivalence.py`'s.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import autopar
from autopar.cli import main
from autopar.errors import (
    LossError,
    MicrobatchError,
    PipelineError,
    PlanFormatError,
    PlanningError,
)
from autopar.passes.capturing.capture import capture, is_training
from autopar.planning.prefill import pinned_state
from autopar.present.report import render_html

ROOT = Path(__file__).resolve().parents[2]
MESH = autopar.Mesh((2,), ("tp",), hardware="cpu")


class Classifier(nn.Module):
    """Two linear layers with dropout between them, returning logits (no loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.5),
                                  nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class WithLoss(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).square().mean()


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(8, 32, generator=torch.Generator().manual_seed(0)),)


def test_a_forward_only_plan_has_no_backward_gradients_or_optimizer_state():
    torch.manual_seed(0)
    model = Classifier()
    served = autopar.plan(model, MESH, _inputs(), training=False, time_limit=5.0)
    trained = autopar.plan(WithLoss(model), MESH, _inputs(), time_limit=5.0)
    assert not served.training and trained.training
    assert all(direction == "forward" for _, _, direction in served.comm_bytes())
    assert served.optimizer_s == 0.0 and trained.optimizer_s > 0.0
    assert "forward only" in served.optimizer
    # Weights without gradients or AdamW's two states: a quarter of the training plan's.
    assert served.peak_memory_bytes < trained.peak_memory_bytes / 2
    # The forward's FLOPs only: a third of a training step's (backward twice the forward).
    assert served.model_flops == pytest.approx(trained.model_flops / 3, rel=0.05)
    assert served.step_time_s < trained.step_time_s


def test_capture_for_inference_traces_eval_mode_and_restores_the_model():
    model = Classifier()
    frozen = model.body[0].bias.requires_grad_(False)
    gm = capture(model, _inputs(), training=False)
    assert not is_training(gm)
    # Eval mode: dropout traced away, where training mode keeps it.
    assert not any("dropout" in str(n.target) for n in gm.graph.nodes)
    assert any("dropout" in str(n.target) for n in capture(model, _inputs()).graph.nodes)
    assert model.training and model.body[2].training
    assert model.body[0].weight.requires_grad and not frozen.requires_grad


def test_a_forward_only_plan_survives_its_json():
    plan = autopar.plan(Classifier(), MESH, _inputs(), training=False, time_limit=5.0)
    assert autopar.Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    older = {k: v for k, v in plan.to_dict().items() if k != "training"}
    assert autopar.Plan.from_dict({**older, "version": 6}).training


@pytest.mark.parametrize(("options", "error"), [
    ({"training": "no"}, PlanningError),
    ({"training": False, "pipeline": autopar.Pipeline(schedule="1F1B")}, PipelineError),
    ({"training": False, "microbatches": 4}, MicrobatchError),
    ({"outputs": "sharded"}, PlanningError),  # a training step returns its loss whole
    ({"training": False, "outputs": "split"}, PlanningError),
])
def test_bad_inference_options_are_refused_before_solving(options, error):
    with pytest.raises(error) as raised:
        autopar.plan(Classifier(), MESH, _inputs(), **options)
    assert "expected" in str(raised.value) and "fix" in str(raised.value)


class Stack(nn.Module):
    """Four blocks of a ModuleList, returning logits: what a pipeline cuts."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def test_a_forward_only_pipeline_sends_forward_and_broadcasts_the_outputs():
    mesh = autopar.Mesh((2,), ("pp",), hardware="cpu")
    plan = autopar.plan(Stack(), mesh, _inputs(), training=False,
                        pipeline=autopar.Pipeline(), time_limit=5.0)
    record = plan.pipeline
    assert record is not None and record.microbatches == 1 and len(record.stages) == 2
    assert all(direction == "forward" for _, _, direction in plan.comm_bytes())
    # The last stage's logits (8 x 10 float32) reach the other pipeline rank whole; the
    # first stage sends its 8 x 32 activations; nothing is reduced over the stages.
    assert plan.comm_bytes(0) == {("broadcast", "pp", "forward"): 8 * 10 * 4,
                                  ("send", "pp", "forward"): 8 * 32 * 4}
    assert [t.kind for t in record.transfers] == ["broadcast"]
    assert plan.pipeline.stages[0].time_s > 0 and plan.optimizer_s == 0.0
    page = render_html(plan)  # the report's timeline: forwards, no backward lanes
    assert page.count('data-kind="F"') == 2 and 'data-kind="B"' not in page


def test_a_forward_only_pipeline_runs_micro_batches_where_the_forward_splits():
    mesh = autopar.Mesh((2,), ("pp",), hardware="cpu")
    plan = autopar.plan(Stack(), mesh, _inputs(), training=False,
                        pipeline=autopar.Pipeline(schedule="1F1B"), time_limit=5.0)
    assert plan.pipeline.microbatches >= 2  # 1F1B runs at least one per rank
    # The logits of all the micro-batches (8 x 10 float32), once, whole.
    assert plan.comm_bytes(0)[("broadcast", "pp", "forward")] == 8 * 10 * 4
    served, inputs = _decoder()  # its KV cache holds the whole batch's sequences
    with pytest.raises(MicrobatchError, match="runs its batch whole") as raised:
        autopar.plan(served, mesh, inputs, training=False,
                     pipeline=autopar.Pipeline(microbatches=2))
    assert "fix" in str(raised.value)


def test_outputs_left_sharded_are_planned_split_and_stated():
    mesh = autopar.Mesh((2,), ("tp",), hardware="cpu")
    whole = autopar.plan(Stack(), mesh, _inputs(), training=False, time_limit=5.0)
    sharded = autopar.plan(Stack(), mesh, _inputs(), training=False, outputs="sharded",
                           time_limit=5.0)
    assert (whole.outputs, sharded.outputs) == ("whole", "sharded")
    placed = next(n for n in sharded.nodes if n.role == "output").inputs
    assert next(n for n in whole.nodes if n.role == "output").inputs == ("R",)
    # Left as the data-parallel batch split: nothing moves at all.
    assert placed == ("S(0)",) and sharded.comm_bytes() == {}
    assert sharded.step_time_s <= whole.step_time_s
    assert autopar.Plan.from_dict(json.loads(json.dumps(sharded.to_dict()))) == sharded
    with pytest.raises(PlanFormatError, match="returns its outputs sharded"):
        autopar.compile(Stack(), autopar.Mesh((1,), ("x",), hardware="cpu"), _inputs(),
                        plan=dataclasses.replace(sharded, mesh=autopar.Mesh(
                            (1,), ("x",), hardware="cpu")), training=False)
    with pytest.raises(PipelineError, match="returns its outputs whole"):
        autopar.plan(Stack(), autopar.Mesh((2,), ("pp",), hardware="cpu"), _inputs(),
                     training=False, outputs="sharded", pipeline=autopar.Pipeline())


def _decoder() -> tuple[autopar.CachedLM, tuple[torch.Tensor, torch.Tensor]]:
    """A tiny Llama with a 16-position cache for 2 sequences, and its decode inputs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa"))
    return (autopar.CachedLM(lm, batch=2, max_len=16),
            (torch.zeros(2, 1, dtype=torch.long), torch.tensor([0])))


def test_a_decode_plan_predicts_its_prefill_with_the_weights_where_it_stores_them():
    served, inputs = _decoder()
    plan = autopar.plan(served, MESH, inputs, training=False, prefill=8, time_limit=5.0)
    assert plan.prefill_tokens == 8 and plan.prefill_s > plan.step_time_s > 0
    assert plan.prefill_peak_bytes > 0
    pinned = {n.name: n.output for n in plan.nodes if n.role in ("parameter", "buffer")}
    prefill = autopar.plan(served, MESH, (torch.zeros(2, 8, dtype=torch.long),
                                          torch.arange(8)),
                           training=False, constraints=pinned, time_limit=5.0)
    assert prefill.step_time_s == pytest.approx(plan.prefill_s)
    assert prefill.peak_memory_bytes == pytest.approx(plan.prefill_peak_bytes)
    assert "predicted time to first token" in autopar.summary(plan)
    assert autopar.Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_a_pipelined_decode_plan_s_prefill_is_cut_into_its_stages():
    served, inputs = _decoder()
    mesh = autopar.Mesh((2,), ("pp",), hardware="cpu")
    plan = autopar.plan(served, mesh, inputs, training=False, pipeline=autopar.Pipeline(),
                        prefill=8, time_limit=5.0)
    assert plan.pipeline is not None and plan.prefill_s > plan.step_time_s > 0
    cuts = tuple(stage.units[0] for stage in plan.pipeline.stages[1:])
    prefill = autopar.plan(served, mesh, (torch.zeros(2, 8, dtype=torch.long), torch.arange(8)),
                           training=False, pipeline=autopar.Pipeline(cuts=cuts),
                           constraints=pinned_state(plan), time_limit=5.0)
    assert prefill.step_time_s == pytest.approx(plan.prefill_s)
    assert [s.units for s in prefill.pipeline.stages] == [s.units for s in plan.pipeline.stages]


@pytest.mark.parametrize(("model", "options", "match"), [
    ("decoder", {"prefill": 8}, "training=False"),  # a training step
    ("decoder", {"training": False, "prefill": 0}, "positive int"),
    ("classifier", {"training": False, "prefill": 8}, "decode program"),
    ("decoder", {"training": False, "prefill": 17}, "fit the KV cache"),
])
def test_a_prefill_that_can_t_be_planned_is_refused(model, options, match):
    served, inputs = _decoder() if model == "decoder" else (Classifier(), _inputs())
    with pytest.raises(PlanningError, match=match) as raised:
        autopar.plan(served, MESH, inputs, time_limit=5.0, **options)
    assert "fix" in str(raised.value)


def test_a_model_without_a_loss_is_pointed_to_inference():
    with pytest.raises(LossError, match="training=False"):
        autopar.plan(Classifier(), MESH, _inputs())


def test_compile_refuses_a_plan_made_for_the_other_mode():
    mesh = autopar.Mesh((1,), ("x",), hardware="cpu")
    model = Classifier()
    served = autopar.plan(model, mesh, _inputs(), training=False, time_limit=5.0)
    with pytest.raises(PlanFormatError, match="made for inference, not a training step"):
        autopar.compile(WithLoss(model), mesh, _inputs(), plan=served)
    pm = autopar.compile(model, mesh, _inputs(), plan=served, training=False)
    out = pm(*_inputs())
    model.eval()
    with torch.no_grad():
        assert torch.equal(out, model(*_inputs()))
    assert not out.requires_grad


def test_the_command_plans_for_inference(tmp_path):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(main, [
        "plan", str(ROOT / "examples" / "mlp.py"), "--mesh", "2", "--hardware", "a100-sxm",
        "--inference", "--no-hand-strategies", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "predicted latency" in result.output and "one forward, inference" in result.output
    assert "recomputed in the backward" not in result.output
    assert json.loads(out.read_text())["training"] is False
    assert json.loads(out.read_text())["outputs"] == "whole"
    result = CliRunner().invoke(main, [
        "plan", str(ROOT / "examples" / "mlp.py"), "--mesh", "2", "--hardware", "a100-sxm",
        "--inference", "--sharded-outputs", "--no-hand-strategies", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["outputs"] == "sharded"


DECODER_FILE = """
import torch
import autopar
from examples.causal_lm import build as build_lm


def build():
    lm, _ = build_lm(batch=2)
    return (autopar.CachedLM(lm, batch=2, max_len=32),
            (torch.zeros(2, 1, dtype=torch.long), torch.tensor([0])))
"""


def test_the_command_plans_a_decode_program_with_its_prefill(tmp_path):
    model_file = tmp_path / "decoder.py"
    model_file.write_text(DECODER_FILE)
    result = CliRunner().invoke(main, [
        "plan", str(model_file), "--mesh", "2", "--hardware", "a100-sxm", "--inference",
        "--prefill", "16", "--no-hand-strategies", "--time-limit", "5"])
    assert result.exit_code == 0, result.output
    assert "per output token" in result.output and "KV cache" in result.output
    assert "predicted time to first token" in result.output
    assert "16-token prompts" in result.output


def test_the_report_draws_a_forward_only_plan_without_backward(tmp_path):
    plan = autopar.plan(Classifier(), MESH, _inputs(), training=False, time_limit=5.0)
    page = Path(autopar.report(plan, tmp_path / "plan.html")).read_text()
    assert "one forward (inference" in page and "latency" in page
    assert "forward + backward" not in page and "optimizer step" not in page


def test_a_forward_only_plan_compares_the_serving_hand_strategies():
    mesh = autopar.Mesh((2, 2), ("dp", "tp"), hardware="cpu")
    served = autopar.plan(Classifier(), mesh, _inputs(), training=False, time_limit=5.0,
                          hand_strategies=True)
    names = {record.name for record in served.hand_strategies}
    assert {"data parallel", "Megatron tensor parallel", "data x tensor parallel"} <= names
    # Recomputation in the backward and a distributed optimizer: nothing to a forward.
    assert not names & {"FSDP + full recompute",
                        "Megatron TP + selective recompute + distributed optimizer"}
    fitting = [r.step_time_s for r in served.hand_strategies if r.fits and r.step_time_s]
    assert fitting and served.step_time_s <= min(fitting) * (1 + 1e-9)
