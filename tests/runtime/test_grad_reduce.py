"""Replicated parameters' gradients reduced in the background of the backward: a gradient
that fills a bucket alone is summed in place, and only when no other branch can hold it.
Kept-gathered (ZeRO-2) and regathered (ZeRO-3) parameters' gradients are reduce-scattered in
the background too, a bounded number at once."""

from __future__ import annotations

import pytest
import torch
from compile_workers import (
    kept_gathered_async_against_sync,
    large_gradients_accumulated,
    regathered_async_against_sync,
)

from autopar.runtime.grad_reduce import SCATTERS_IN_FLIGHT, owns_gradient
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


def test_kept_gathered_gradients_are_scattered_in_the_background_like_the_sync_path():
    # Gathered along dim 0 and dim 1 (a movedim before the scatter): two passes without
    # zero_grad give the synchronous path's gradients, the scatter is still in flight while
    # the backward goes on, and the counters agree byte for byte.
    results = launch(kept_gathered_async_against_sync, 2, timeout=120.0)
    nbytes = 8 * 6 * 4
    for reports in results:
        for dim, report in enumerate(reports):
            assert report["error"] <= 1e-6 * report["scale"], (dim, report)
            assert report["owns"] and report["shape"] == report["expected_shape"], report
            assert report["async"] == report["sync"] == {
                ("all_gather", "dp", "forward"): 2 * nbytes,
                ("reduce_scatter", "dp", "backward"): 2 * nbytes}, report
            assert report["async_calls"][("reduce_scatter", "dp", "backward")] == 2, report
            assert report["seen"] == [(1, True), (1, False)], report
            assert report["left"] == 0, report


def test_regathered_gradients_are_scattered_in_the_background_a_few_at_once():
    # ZeRO-3: the background path gives the synchronous path's gradients and moves the same
    # bytes (a forward gather and a reduce-scatter per weight, a backward regather of each
    # but the first, which no op saves: the input needs no gradient), with no more than
    # SCATTERS_IN_FLIGHT scatters holding their whole gradients at any time.
    results = launch(regathered_async_against_sync, 2, timeout=120.0)
    nbytes = 6 * 6 * 4
    for report in results:
        assert report["error"] <= 1e-6, report
        assert report["async"] == report["sync"] == {
            ("all_gather", "dp", "forward"): 5 * nbytes,
            ("all_gather", "dp", "backward"): 4 * nbytes,
            ("reduce_scatter", "dp", "backward"): 5 * nbytes}, report
        assert report["seen"] == 5 and report["most_in_flight"] == SCATTERS_IN_FLIGHT, report
