"""The memory a plan may fill by default: the capacity less a reserve
(`HardwareProfile.reserve_bytes`), measured or assumed."""

from __future__ import annotations

import dataclasses

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
