"""Hand strategies costed alongside the solver's plan (`autopar.planning.hand_strategies`)."""

import dataclasses

import pytest

import autopar
from autopar.values.plan import SINGLE_DEVICE, Plan, scaling_efficiency
from examples import gpt, mlp

MEGATRON_3D = "Megatron 3D"
NAMES = ("data parallel", "fully sharded (ZeRO-3)", "Megatron tensor parallel",
         "FSDP + full recompute", "Megatron TP + selective recompute + distributed optimizer",
         "data x tensor parallel", "CP x TP x FSDP")


@pytest.fixture(scope="module")
def small_plan():
    model, inputs = mlp.build(batch=64, hidden=256, ffn=1024, device="meta")
    mesh = autopar.Mesh((2, 2), ("dp", "tp"), hardware="a100-sxm")
    return autopar.plan(model, mesh, inputs, hand_strategies=True, time_limit=10)


def test_every_standard_strategy_is_costed_no_better_than_the_solver(small_plan):
    records = {r.name: r for r in small_plan.hand_strategies}
    assert set(records) == {*NAMES, MEGATRON_3D, SINGLE_DEVICE}
    # Both axes of the mesh are inside one node, and none is named pp: no pipeline axis.
    assert records[MEGATRON_3D].step_time_s is None and "pp" in records[MEGATRON_3D].note
    for name in NAMES:
        record = records[name]
        assert record.step_time_s is not None, record.note
        assert record.optimizer_s > 0
        assert (record.compute_s + record.comm_s - record.hidden_comm_s
                + record.optimizer_s) == pytest.approx(record.step_time_s)
        assert 0 <= record.hidden_comm_s <= record.comm_s
        assert record.peak_memory_bytes > 0
        if record.fits:
            assert small_plan.step_time_s <= record.step_time_s * (1 + 1e-9), name
    dp = records["data parallel"]
    assert dp.step_time_s >= small_plan.step_time_s
    assert {kind for kind, *_ in dp.comm_bytes} >= {"all_reduce"}  # the gradients
    zero = records["fully sharded (ZeRO-3)"]
    assert {kind for kind, *_ in zero.comm_bytes} >= {"all_gather", "reduce_scatter"}
    assert zero.peak_memory_bytes < dp.peak_memory_bytes


def test_recomputing_strategies_buy_memory_with_compute():
    """On a decoder with blocks, FSDP with every block recomputed keeps less than plain
    ZeRO-3 and computes more (each block's forward again); Megatron with a distributed
    optimizer over dp gathers the parameters there and reduce-scatters their gradients."""
    model, inputs = gpt.build(batch=8, seq=128, hidden=128, heads=4, layers=2, device="meta")
    mesh = autopar.Mesh((2, 2), ("dp", "tp"), hardware="a100-sxm")
    plan = autopar.plan(model, mesh, inputs, hand_strategies=True, time_limit=10)
    records = {r.name: r for r in plan.hand_strategies}
    zero, fsdp = records["fully sharded (ZeRO-3)"], records["FSDP + full recompute"]
    assert fsdp.compute_s > zero.compute_s and fsdp.peak_memory_bytes < zero.peak_memory_bytes
    megatron = records["Megatron TP + selective recompute + distributed optimizer"]
    assert megatron.step_time_s is not None, megatron.note
    assert {kind for kind, axis, *_ in megatron.comm_bytes if axis == "dp"} >= {
        "all_gather", "reduce_scatter"}


def test_efficiency_is_against_one_device_compute_over_the_devices(small_plan):
    single = next(r for r in small_plan.hand_strategies if r.name == SINGLE_DEVICE)
    assert single.comm_s == 0 and single.comm_bytes == ()
    efficiency = scaling_efficiency(small_plan, small_plan.step_time_s)
    assert efficiency == pytest.approx(single.compute_s / 4 / small_plan.step_time_s)
    assert 0 < efficiency <= 1


def test_summary_compares_and_the_records_survive_a_save(small_plan, tmp_path):
    text = autopar.summary(small_plan)
    assert "predicted step time" in text and "Compared with hand strategies" in text
    # Long names wrap inside their table cell: look for their words.
    assert all(word in text for name in NAMES for word in name.split())
    assert "scaling efficiency" in text
    path = tmp_path / "plan.json"
    small_plan.save(path)
    assert Plan.load(path).hand_strategies == small_plan.hand_strategies
    bare = dataclasses.replace(small_plan, hand_strategies=())
    assert "Compared with" not in autopar.summary(bare)


def test_large_batch_small_layer_solver_is_data_parallel():
    """The textbook case (tests/test_textbook.py): the solver's plan is data parallelism
    with a distributed optimizer, so the best data-parallel plan costs the same but for
    the optimizer's step, which the solver's divides over the ranks."""
    model, inputs = mlp.build(batch=16384, hidden=512, ffn=2048, device="meta")
    mesh = autopar.Mesh((8,), ("dp",), hardware="h100-sxm")
    plan = autopar.plan(model, mesh, inputs, hand_strategies=True)
    records = {r.name: r for r in plan.hand_strategies}
    dp = records["data parallel"]
    assert plan.step_time_s <= dp.step_time_s
    assert dp.step_time_s - plan.step_time_s <= dp.optimizer_s - plan.optimizer_s + 1e-12
    assert plan.optimizer_s < dp.optimizer_s
    assert dp.fits
    tensor = records["data x tensor parallel"]
    assert tensor.step_time_s is None and "2 axes" in tensor.note
    assert all(r.step_time_s is not None or r.note for r in plan.hand_strategies)


def test_hand_strategies_are_off_by_default():
    model, inputs = mlp.build(batch=8, device="meta")
    plan = autopar.plan(model, autopar.Mesh((2,), ("dp",), hardware="h100-sxm"), inputs)
    assert plan.hand_strategies == () and "Compared with" not in autopar.summary(plan)


def test_a_strategy_over_the_budget_is_costed_but_does_not_fit(small_plan):
    """Hand strategies are solved with no memory limit; `fits` compares with the budget."""
    records = {r.name: r for r in small_plan.hand_strategies}
    dp, zero = records["data parallel"], records["fully sharded (ZeRO-3)"]
    budget = (dp.peak_memory_bytes + zero.peak_memory_bytes) / 2
    model, inputs = mlp.build(batch=64, hidden=256, ffn=1024, device="meta")
    plan = autopar.plan(model, small_plan.mesh, inputs, hand_strategies=True, time_limit=10,
                        memory_budget=budget)
    again = {r.name: r for r in plan.hand_strategies}
    assert plan.peak_memory_bytes <= budget
    assert not again["data parallel"].fits and again["fully sharded (ZeRO-3)"].fits
    assert again["data parallel"].step_time_s == pytest.approx(dp.step_time_s)
    assert "over memory" in autopar.summary(plan)


def _data_parallel(model, inputs, mesh):
    """The data-parallel record (and the single-device one) of `model`, alone."""
    from autopar.passes.capturing.annotate import annotate
    from autopar.passes.capturing.capture import capture
    from autopar.planning.hand_strategies import evaluate_hand_strategies, standard_hand_strategies

    gm = annotate(capture(model, inputs))
    dp = next(s for s in standard_hand_strategies(mesh) if s.name == "data parallel")
    records = evaluate_hand_strategies(gm, mesh, memory_budget=2**34, time_limit=10,
                                       strategies=(dp,)).records
    return records[0]


def test_data_parallel_moves_only_all_reduces():
    """Pure data parallelism: parameters replicated, the batch split through every
    activation, so only the gradients (and the loss) are all-reduced. Left to itself, the
    solver gathered the token embeddings over tp on a cpu mesh, a plan that is not data
    parallel."""
    model, inputs = gpt.build(hidden=64, heads=4, layers=2, batch=8)
    mesh = autopar.Mesh((2, 2), ("dp", "tp"), hardware="cpu")
    record = _data_parallel(model, inputs, mesh)
    assert record.step_time_s is not None, record.note
    assert {kind for kind, *_ in record.comm_bytes} == {"all_reduce"}, record.comm_bytes
    assert {axis for _, axis, *_ in record.comm_bytes} == {"dp", "tp"}  # batch over both
    assert record.note == ""


def test_data_parallel_says_why_it_gathers_or_keeps_an_axis_whole(monkeypatch):
    """An op no rule splits along the batch makes data parallelism gather its input; a batch
    too small for the mesh leaves an axis replicated: the note says so."""
    import torch
    from torch import nn

    from autopar import rules

    lookup = rules.lookup
    monkeypatch.setattr(rules, "lookup", lambda target: None
                        if target is torch.ops.aten.flip.default else lookup(target))

    class Flip(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            return torch.flip(self.fc(x), dims=(1,)).pow(2).mean()

    mesh = autopar.Mesh((2, 2), ("dp", "tp"), hardware="cpu")
    record = _data_parallel(Flip(), (torch.randn(8, 16),), mesh)
    assert "all_gather" in {kind for kind, *_ in record.comm_bytes}
    assert "not purely data parallel: flip.default (top) can't keep the batch split" in \
        record.note, record.note
    model, inputs = mlp.build(batch=2)
    record = _data_parallel(model, inputs, mesh)
    assert {(kind, axis) for kind, axis, *_ in record.comm_bytes} == {("all_reduce", "dp")}
    assert "the batch (2) does not split further over tp" in record.note, record.note
