"""The mean-as-sum rewrites are exact (values and gradients), and after them a batch-split
loss needs no gather: every op from the logits to the loss offers the batch split."""

from __future__ import annotations

import pytest
import torch
from rule_cases import f, ints
from simulate import build
from torch import nn

from autopar.rules import lookup
from autopar.rules.common import P, S
from autopar.rules.decompositions import DECOMPOSITIONS
from examples import gpt, mlp

aten = torch.ops.aten

_targets = ints(16, 8)
_targets[::3] = -1
CALLS = [
    (aten.mean.dim, (f(4, 8, 4), [0, 2], True)),
    (aten.mean.dim, (f(4, 8), [])),
    (aten.mean.default, (f(4, 8),)),
    (aten.cross_entropy_loss.default, (f(8, 16), ints(16, 8))),
    (aten.cross_entropy_loss.default, (f(8, 16), _targets, None, 1, -1, 0.1)),
    (aten.cross_entropy_loss.default, (f(8, 16), f(8, 16).softmax(-1), None, 1, -100, 0.2)),
    (aten.cross_entropy_loss.default, (f(4, 16, 4), ints(16, 4, 4))),
    (aten.nll_loss_nd.default, (f(8, 16).log_softmax(-1), _targets, None, 1, -1)),
    (aten.nll_loss.default, (f(8, 16).log_softmax(-1), ints(16, 8))),
    (aten.mse_loss.default, (f(4, 8), f(4, 8))),
    (aten.l1_loss.default, (f(4, 8), f(4, 8))),
    (aten.smooth_l1_loss.default, (f(4, 8), f(4, 8), 1, 0.5)),
    (aten.huber_loss.default, (f(4, 8), f(4, 8), 1, 0.5)),
    (aten.binary_cross_entropy_with_logits.default,
     (f(4, 8), torch.rand(4, 8, dtype=torch.float64), f(8).abs(), f(8).abs())),
]


@pytest.mark.parametrize("target,args", CALLS, ids=[f"{t}-{i}" for i, (t, _) in
                                                    enumerate(CALLS)])
def test_decomposition_is_exact(target, args) -> None:
    def run(fn):
        x = args[0].clone().requires_grad_()
        out = fn(x, *args[1:])
        return out, torch.autograd.grad((out * torch.arange(out.numel()).view(out.shape)).sum(), x)

    want, want_grads = run(target)
    got, got_grads = run(DECOMPOSITIONS[target])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grads, want_grads)


def test_class_weights_and_other_reductions_are_kept() -> None:
    x, t = f(8, 16), ints(16, 8)
    assert DECOMPOSITIONS[aten.cross_entropy_loss.default](x, t, f(16)) is NotImplemented
    assert DECOMPOSITIONS[aten.mse_loss.default](x, x, 2) is NotImplemented


def _strategies_of(node: torch.fx.Node) -> list:
    def real(value):
        if isinstance(value, torch.fx.Node):
            return torch.zeros(value.meta["val"].shape, dtype=value.meta["val"].dtype)
        return value

    op, _ = build(node.target, tuple(map(real, node.args)), dict(node.kwargs))
    return lookup(node.target)(op)


def _batch_split_reaches_the_loss(model: nn.Module, inputs: tuple) -> torch.fx.Graph:
    """Below the rewritten mean, the loss takes batch-split inputs to a partial sum, and
    each division by the count keeps it partial: no gather of the batch."""
    ep = torch.export.export(model, inputs, strict=False).run_decompositions(DECOMPOSITIONS)
    assert torch.allclose(ep.module()(*inputs), model(*inputs))
    node = next(iter(ep.graph.find_nodes(op="output"))).args[0][0]
    while node.target == aten.div.Tensor:
        assert any(s.inputs[0] == P and s.output == P for s in _strategies_of(node))
        node = node.args[0]
    assert node.target in (aten.mse_loss.default, aten.cross_entropy_loss.default), node
    assert any(s.inputs[0] == S(0) and s.output == P for s in _strategies_of(node))
    return ep.graph


def test_data_parallel_mse_needs_no_gather() -> None:
    _batch_split_reaches_the_loss(*mlp.build(batch=8, hidden=8, ffn=16))


def test_data_parallel_cross_entropy_needs_no_gather() -> None:
    graph = _batch_split_reaches_the_loss(*gpt.build(vocab=32, seq=8, hidden=16, heads=2,
                                                     layers=1))
    ops = {n.target for n in graph.nodes}
    assert aten.ne.Scalar in ops and aten.sum.default in ops  # the count, a batch sum
