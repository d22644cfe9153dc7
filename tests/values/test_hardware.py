"""The memory a plan may fill by default: the capacity less a reserve
(`HardwareProfile.reserve_bytes`), measured or assumed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import autopar
from autopar.values.hardware import RESERVE_BYTES, RESERVE_SHARE, load_hardware
from examples import mlp

GIB = 2**30


def test_a_datasheet_profile_reserves_the_context_communicators_and_fragmentation() -> None:
    h100 = load_hardware("h100-sxm")
    assert h100.reserve_bytes == RESERVE_BYTES + int(RESERVE_SHARE * h100.memory_bytes)
    assert h100.reserve_bytes == 6 * GIB  # 2 GiB + 5% of 80 GiB


def test_a_measured_profile_reserves_what_it_found_unusable() -> None:
    measured = dataclasses.replace(load_hardware("cpu"), usable_memory_bytes=10 * GIB)
    assert measured.reserve_bytes == 6 * GIB  # 16 GiB capacity


def test_plans_leave_the_reserve_free_by_default_and_say_so() -> None:
    model, inputs = mlp.build(device="meta")
    mesh = autopar.Mesh((2, 4), ("dp", "tp"), hardware="h100-sxm")
    plan = autopar.plan(model, mesh, inputs, time_limit=5)
    assert plan.memory_limit_bytes == 74 * GIB and plan.peak_memory_bytes <= 74 * GIB
    assert "80.00 GiB device less 6.00 GiB reserved" in autopar.summary(plan)
    given = autopar.plan(model, mesh, inputs, time_limit=5, memory_budget=80 * GIB)
    assert given.memory_limit_bytes == 80 * GIB
    assert "80.00 GiB device less 0 B reserved" in autopar.summary(given)


def test_a_plan_on_a_profile_read_from_a_file_reads_back_without_the_file(tmp_path) -> None:
    """A mesh on a profile that is not bundled carries the whole profile in its data, so a
    plan sent to other ranks or saved reads back where the file is not."""
    import json

    data = json.loads((Path(autopar.__file__).parent / "values/profiles/cpu.json").read_text())
    data.update(name="my-cluster", optimizer_element_s=2e-9, optimizer_tensor_s=1e-5,
                overlap_slowdown=0.5, kernel_flops={"attention": 3e10})
    data["links"][0]["collectives"] = {"all_gather": {"bandwidth": 1e9, "latency": 1e-4}}
    path = tmp_path / "my-cluster.json"
    path.write_text(json.dumps(data))
    mesh = autopar.Mesh((2,), ("dp",), hardware=str(path))
    path.unlink()
    again = autopar.Mesh.from_dict(json.loads(json.dumps(mesh.to_dict())))
    assert again.hardware == mesh.hardware and again == mesh
    bundled = autopar.Mesh((2,), ("dp",), hardware="h100-sxm")
    assert bundled.to_dict()["hardware"] == "h100-sxm"


def test_a_profile_says_which_kind_of_device_it_is_of() -> None:
    assert load_hardware("h100-sxm").device == "cuda"
    data = {**load_hardware("cpu").to_dict(), "device": "cpu"}
    assert autopar.HardwareProfile.from_dict(data).device == "cpu"
    with pytest.raises(autopar.HardwareError, match="device one of cuda, cpu"):
        autopar.HardwareProfile.from_dict({**data, "device": "tpu"})
