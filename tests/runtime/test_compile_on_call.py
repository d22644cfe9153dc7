"""`autopar.compile(model, mesh)` without example inputs compiles at the first call.

On 2 gloo ranks: an optimizer made from `pm.parameters()` before the first call steps the
compiled pieces; a call at other shapes compiles again (parameters pinned where they are
stored), and every loss and the final parameters equal the plain model's. A torch
DeviceMesh works in place of an `autopar.Mesh`; with `replan=False` new shapes are refused.
"""

from __future__ import annotations

import pytest
from compile_on_call_workers import fixed_plan_refuses_new_shapes, train_through_new_shapes

from autopar.runtime.launch import launch


@pytest.mark.parametrize("use_device_mesh", [False, True], ids=["autopar-mesh", "device-mesh"])
def test_compiles_at_the_first_call_and_again_for_new_shapes(use_device_mesh):
    for result in launch(train_through_new_shapes, 2, use_device_mesh, timeout=300.0):
        for got, expected in result["losses"]:
            assert abs(got - expected) <= 1e-6 * abs(expected), result["losses"]
        assert result["param_error"] <= 1e-6
        assert result["programs"] == 2  # batch 8 and batch 4; the last call reuses batch 8's
        assert result["axes"] == ("dp",)


def test_a_fixed_plan_refuses_new_shapes():
    messages = launch(fixed_plan_refuses_new_shapes, 2, timeout=300.0)
    assert all("differs from the example input" in m for m in messages), messages
