"""Replicated parameters' gradients reduced in the background of the backward: a gradient
that fills a bucket alone is summed in place, and only when no other branch can hold it."""

from __future__ import annotations

import pytest
import torch
from compile_workers import large_gradients_accumulated

from autopar.runtime.grad_reduce import owns_gradient
from autopar.runtime.launch import launch

aten = torch.ops.aten


@pytest.mark.parametrize("op", [aten.linear.default, aten.addmm.default, aten.mm.default,
                                aten.embedding.default, aten.convolution.default,
                                aten.native_layer_norm.default, aten.mul.Tensor])
def test_ops_that_make_their_operands_gradients_own_them(op):
    assert owns_gradient(op)


@pytest.mark.parametrize("op", [aten.add.Tensor, aten.sub.Tensor, aten.clone.default,
                                aten.view.default, aten.t.default, aten.cat.default,
                                aten._to_copy.default, "output", None])
def test_ops_that_may_pass_their_incoming_gradient_on_do_not(op):
    # `add` returns the incoming gradient to both operands, `clone` and views hand it (or a
    # view of it) on: summing it in place would change another branch's gradient too.
    assert not owns_gradient(op)


def test_gradients_reduced_in_place_accumulate_exactly():
    # Each 1 MiB weight gradient is one all-reduce of its own, summed where it lies; the
    # biases' gradients share one bucket. Two backward passes add up exactly.
    results = launch(large_gradients_accumulated, 2, timeout=120.0)
    for error, sizes in results:
        assert error < 1e-6, results
        assert sizes == [256 + 1024, 256 * 1024, 1024 * 256], sizes
