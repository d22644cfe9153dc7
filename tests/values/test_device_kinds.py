"""Meshes of several kinds of device: one kind per index of the outermost axis or per
device, costed with the slowest of every figure (`autopar.values.device_kinds`), per-device
budgets binding at their least, and bad lists refused before anything is planned."""

from __future__ import annotations

import dataclasses

import pytest

import autopar
from autopar.errors import HardwareError, MeshError, PlanningError
from autopar.values.device_kinds import slowest
from autopar.values.hardware import load_hardware
from examples import mlp

H100, A100 = load_hardware("h100-sxm"), load_hardware("a100-sxm")


def test_one_kind_per_outer_index_covers_its_block_of_the_mesh():
    mesh = autopar.Mesh((2, 4), ("node", "gpu"), hardware=["h100-sxm", "a100-sxm"])
    assert [kind.name for kind in mesh.kinds] == ["h100-sxm"] * 4 + ["a100-sxm"] * 4
    per_device = autopar.Mesh((2, 4), ("node", "gpu"),
                              hardware=["h100-sxm"] * 4 + ["a100-sxm"] * 4)
    assert per_device == mesh
    assert [k.name for k in mesh.kinds_at(0, 1)] == ["a100-sxm"]
    assert [k.name for k in mesh.kinds_at(1, 0)] == ["h100-sxm", "a100-sxm"]
    assert "4 h100-sxm + 4 a100-sxm" in mesh.describe()
    assert autopar.Mesh.from_dict(mesh.to_dict()) == mesh
    # One kind however given is a mesh of that kind.
    assert autopar.Mesh((2,), ("x",), hardware=["a100-sxm"] * 2) == \
        autopar.Mesh((2,), ("x",), hardware="a100-sxm")


def test_the_cost_profile_takes_the_slowest_of_every_figure():
    faster_memory = dataclasses.replace(A100, name="a100-fast-hbm", memory_bandwidth=4e12,
                                        memory_bytes=40 * 2**30)
    mixed = slowest([H100, faster_memory])
    assert dict(mixed.peak_flops)["bfloat16"] == dict(A100.peak_flops)["bfloat16"]
    assert mixed.memory_bandwidth == H100.memory_bandwidth  # the A100-like kind's is faster
    assert mixed.memory_bytes == 40 * 2**30
    assert mixed.memory_bytes - mixed.reserve_bytes == min(
        kind.memory_bytes - kind.reserve_bytes for kind in (H100, faster_memory))
    assert mixed.launch_overhead_s == max(H100.launch_overhead_s, A100.launch_overhead_s)
    for level, h100, a100 in zip(mixed.links, H100.links, A100.links):
        assert level.bandwidth == min(h100.bandwidth, a100.bandwidth)


def test_a_plan_on_a_mixed_mesh_with_even_pieces_takes_the_slower_kind_s_step():
    model, inputs = mlp.build()
    steps = {}
    for name, hardware in (("h100", "h100-sxm"), ("a100", "a100-sxm"),
                           ("mixed", ["h100-sxm", "a100-sxm"])):
        mesh = autopar.Mesh((2, 4), ("dp", "tp"), hardware=hardware, shares="even")
        steps[name] = autopar.plan(model, mesh, inputs, time_limit=5.0).step_time_s
    # An A100 is no faster than an H100 in any figure: the mixed mesh runs at its pace.
    assert steps["mixed"] == pytest.approx(steps["a100"]) and steps["a100"] > steps["h100"]
    # Pieces sized to the kinds (the default) do no worse.
    mixed = autopar.Mesh((2, 4), ("dp", "tp"), hardware=["h100-sxm", "a100-sxm"])
    assert autopar.plan(model, mixed, inputs, time_limit=5.0).step_time_s <= \
        steps["mixed"] * (1 + 1e-9)


def test_per_device_budgets_bind_at_their_least():
    model, inputs = mlp.build()
    mesh = autopar.Mesh((2, 2), ("dp", "tp"), hardware=["h100-sxm", "a100-sxm"])
    plan = autopar.plan(model, mesh, inputs, memory_budget=[8e9, 8e9, 3e9, 3e9],
                        time_limit=5.0)
    assert plan.memory_limit_bytes == 3e9


@pytest.mark.parametrize(("hardware", "error", "match"), [
    (["h100-sxm", "a100-sxm", "a100-sxm"], MeshError, "neither the outermost axis"),
    (["h100-sxm", "b200"], HardwareError, "unknown hardware 'b200'"),
    (["h100-sxm", "cpu"], MeshError, "devices of one type"),
])
def test_bad_kind_lists_are_refused(hardware, error, match):
    with pytest.raises(error, match=match) as raised:
        autopar.Mesh((2, 4), ("dp", "tp"), hardware=hardware)
    assert "fix" in str(raised.value)


@pytest.mark.parametrize("budget", [[8e9] * 3, [8e9, 8e9, -1.0, 8e9]])
def test_a_budget_list_of_the_wrong_length_or_values_is_refused(budget):
    model, inputs = mlp.build()
    mesh = autopar.Mesh((2, 2), ("dp", "tp"), hardware=["h100-sxm", "a100-sxm"])
    with pytest.raises(PlanningError, match="one per device") as raised:
        autopar.plan(model, mesh, inputs, memory_budget=budget)
    assert "fix" in str(raised.value)
