"""Textbook tests of compression (meta device): a 1B GPT in fp32, data parallel.

Over the 100 Gb/s links of `h100-ethernet` (2 nodes of 8) the plan is gradient-bound, and
allowed to, the solver compresses the gradients' reductions and the step is predicted at
least 1.4x faster: in bfloat16 when that is all it may do, by PowerSGD across the nodes
under "auto" (faster still); inside one NVLink node of 8 the gradients' all-reduce hides
behind the backward, compressing it gains nothing, and nothing is compressed. Stored as
ZeRO-3 over both axes, the backward's gathers across nodes go where "hpz" may keep an
in-node copy: the step is faster, for the copies' memory, and faster still with int8
gathers in the forward and the gradients reduced in bfloat16 as well.
"""

from __future__ import annotations

import pytest

import autopar
from examples import gpt


@pytest.fixture(scope="module")
def model():
    return gpt.build(vocab=32000, seq=512, hidden=2048, heads=16, layers=20, batch=32,
                     device="meta")


def _plans(model, mesh: autopar.Mesh) -> dict:
    module, inputs = model
    return {compression: autopar.plan(module, mesh, inputs, strategy="data parallel",
                                      compression=compression, time_limit=20.0)
            for compression in (None, "auto", "bf16-reduce")}


def test_a_gradient_bound_plan_over_slow_links_compresses(model):
    plans = _plans(model, autopar.Mesh((2, 8), ("node", "gpu"), hardware="h100-ethernet"))
    assert not any(n.compression for n in plans[None].nodes)
    for allowed, chosen in (("bf16-reduce", "bf16-reduce"), ("auto", "powersgd-4")):
        compressed = [n for n in plans[allowed].nodes if n.compression == chosen]
        assert len(compressed) >= 40, allowed  # the weights of 20 blocks at least
        assert plans[None].step_time_s >= 1.4 * plans[allowed].step_time_s, allowed
    assert plans["auto"].step_time_s < plans["bf16-reduce"].step_time_s


def test_nothing_is_compressed_inside_an_nvlink_node(model):
    plans = _plans(model, autopar.Mesh((8,), ("gpu",), hardware="h100-sxm"))
    assert not any(n.compression for n in plans["auto"].nodes)
    assert plans["auto"].step_time_s == pytest.approx(plans[None].step_time_s)


def test_zero3_across_nodes_regathers_from_in_node_copies(model):
    module, inputs = model
    mesh = autopar.Mesh((2, 8), ("node", "gpu"), hardware="h100-ethernet")
    exact, hpz, int8, auto = (
        autopar.plan(module, mesh, inputs, strategy="fully sharded (ZeRO-3)",
                     compression=compression, time_limit=20.0)
        for compression in (None, ("hpz",), ("int8-gather",), "auto"))
    copied = [n for n in hpz.nodes if n.compression == "hpz"]
    assert len(copied) >= 40  # the weights of 20 blocks at least
    assert exact.step_time_s >= 1.2 * hpz.step_time_s
    assert hpz.peak_memory_bytes > exact.peak_memory_bytes
    backward = ("all_gather", "node", "backward")
    assert hpz.comm_bytes().get(backward, 0) < exact.comm_bytes()[backward] / 2
    # "auto" takes all three on a weight (ZeRO++'s qwZ, hpZ and its gradients in bf16),
    # faster than any alone.
    chosen = [n for n in auto.nodes if n.compression == "bf16-reduce+int8-gather+hpz"]
    assert len(chosen) >= 40
    assert auto.step_time_s < min(hpz.step_time_s, int8.step_time_s)
