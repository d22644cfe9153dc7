"""The deliberate choices of the rules (what is offered and what is not), stated as tests,
and the local size arguments the lowering must use."""

from __future__ import annotations

import pytest
import torch
from rule_cases import f, ints
from simulate import build

from autopar.rules import AxisStrategy, local_args, lookup
from autopar.rules.common import P, R, S

aten = torch.ops.aten


def strategies(target, *args, **kwargs) -> list[AxisStrategy]:
    op, _ = build(target, args, kwargs)
    return lookup(target)(op)


def outputs(target, *args, **kwargs) -> set:
    return {s.output for s in strategies(target, *args, **kwargs)}


def test_linear_offers_the_alpa_set() -> None:
    got = strategies(aten.linear.default, f(4, 8, 8), f(12, 8), f(12))
    assert got == [
        AxisStrategy((S(0), R, R), S(0)),    # batch
        AxisStrategy((S(1), R, R), S(1)),    # sequence
        AxisStrategy((R, S(0), S(0)), S(2)),  # column
        AxisStrategy((S(2), S(1), P), P),    # row: the bias is a summand, added once
        AxisStrategy((P, R, P), P),          # partial input
    ]


def test_mean_over_a_split_dim_is_not_offered_but_sum_is() -> None:
    assert outputs(aten.mean.dim, f(4, 8), [1]) == {S(0), P}
    assert AxisStrategy((S(1),), P) not in strategies(aten.mean.dim, f(4, 8), [1])
    assert AxisStrategy((S(1),), P) in strategies(aten.sum.dim_IntList, f(4, 8), [1])


@pytest.mark.parametrize("target", [aten.cross_entropy_loss.default, aten.mse_loss.default])
def test_mean_losses_offer_no_split(target) -> None:
    second = ints(16, 8) if target == aten.cross_entropy_loss.default else f(8, 16)
    assert strategies(target, f(8, 16), second) == []
    assert outputs(target, f(8, 16), second, reduction=2) == {P}


def test_nonlinear_ops_never_take_partial() -> None:
    for target, args in [(aten.amax.default, (f(4, 8), [1])), (aten.exp.default, (f(4, 8),)),
                         (aten.add.Tensor, (f(4, 8), 1.0)), (aten.softmax.int, (f(4, 8), 1)),
                         (aten.dropout.default, (f(4, 8), 0.1, True))]:
        assert all(P not in (*s.inputs, s.output) for s in strategies(target, *args)), target


def test_causal_attention_splits_the_sequence_only_on_the_ring() -> None:
    """A causal attention's local mask is right only with every key at hand: its sequence
    splits with the keys' (the ring), never with the keys whole."""
    q = f(2, 4, 8, 8)
    causal = strategies(aten.scaled_dot_product_attention.default, q, q, q, is_causal=True)
    assert {s.output for s in causal} == {S(0), S(1), S(2)}
    assert [s.inputs for s in causal if s.output == S(2)] == [(S(2), S(2), S(2))]
    full = strategies(aten.scaled_dot_product_attention.default, q, q, q)
    assert {s.inputs for s in full if s.output == S(2)} == {(S(2), R, R), (S(2), S(2), S(2))}


def test_attention_with_dropout_or_a_float_mask_runs_no_ring() -> None:
    q = f(2, 4, 8, 8)
    for kwargs in ({"dropout_p": 0.1}, {"attn_mask": f(8, 8)}):
        got = strategies(aten.scaled_dot_product_attention.default, q, q, q, **kwargs)
        assert all(s.inputs[1] != S(2) for s in got), kwargs


def test_cut_dims_stay_whole() -> None:
    assert S(1) not in outputs(aten.split.Tensor, f(4, 8), 4, 1)
    assert S(1) not in outputs(aten.cat.default, [f(4, 8), f(4, 8)], 1)
    assert outputs(aten.squeeze.default, f(4, 1, 8)) == {P}


def test_view_splits_only_the_first_dim_of_a_group() -> None:
    got = strategies(aten.view.default, f(4, 8, 6), [32, 6])
    assert AxisStrategy((S(1),), S(0)) not in got
    assert AxisStrategy((S(0),), S(0)) in got


@pytest.mark.parametrize("target,args,pieces,expect", [
    (aten.view.default, (f(4, 8, 8), [4, 8, 2, -1]), [2, 1, 2, 1], [2, 8, 1, 4]),
    (aten.reshape.default, (f(4, 8), [-1]), [4], [8]),
    (aten._unsafe_view.default, (f(4, 8, 4), [32, 4]), [8, 1], [4, 4]),
    (aten.expand.default, (f(4, 1, 8), [4, 4, -1]), [1, 4, 2], [4, 1, 4]),
    (aten.unflatten.int, (f(2, 32), 1, [4, -1]), [1, 2, 4], [2, 2]),
])
def test_local_shape_arguments(target, args, pieces, expect) -> None:
    op, _ = build(target, args, {})
    shape = [n // k for n, k in zip(op.outputs[0].shape, pieces)]
    new_args, _ = local_args(op, shape)
    assert list(new_args[-1]) == expect


def test_local_args_of_repeat_interleave_and_untouched_ops() -> None:
    op, _ = build(aten.repeat_interleave.self_int, (f(2, 4, 8), 2, 1), {"output_size": 8})
    assert local_args(op, [2, 2, 8])[1] == {"output_size": 2}
    op, _ = build(aten.split.Tensor, (f(4, 8), 4, 1), {})
    assert local_args(op, [2, 4]) == (op.args, dict(op.kwargs))
    op, _ = build(aten.view.default, (f(4, 8), [32]), {})
    assert local_args(op, [32]) == (op.args, {})
    op, _ = build(aten.view.default, (f(7, 8), [7, 2, 4]), {})  # rank 3 of 7 rows in 4
    assert list(local_args(op, [1, 2, 4])[0][-1]) == [1, 2, 4]
