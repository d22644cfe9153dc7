"""`MicroBatches`: one planning call's splits of the step, the same as the micro-batch
pass's for every count, propagated once where the split at one sample per micro-batch is
exact."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autopar
import autopar.planning.microbatches as microbatches
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.passes.layout.split_microbatches import ACCUMULATE, split_microbatches
from autopar.planning.microbatches import MicroBatches
from examples import gpt, moe


class _Pairs(nn.Module):
    """A loss that multiplies the samples of each pair: micro-batches of two samples or
    more give the batch's, single samples do not."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        h = self.linear(x)
        return h.view(h.shape[0] // 2, 2, -1).prod(1).sum()


def _outcome(split, *args, **kwargs):
    try:
        return split(*args, **kwargs)
    except autopar.MicrobatchError as error:
        return type(error), str(error)


@pytest.mark.parametrize("build, mixing", [
    (lambda: gpt.build(batch=4), "refuse"), (lambda: (_Pairs(), (torch.randn(8, 4),)), "refuse"),
    (lambda: moe.build(batch=4), "refuse"), (lambda: moe.build(batch=4), ACCUMULATE)])
def test_each_count_splits_as_the_pass_splits_it(build, mixing):
    model, inputs = build()
    gm = annotate(capture(model, inputs))
    micro = MicroBatches(model, inputs, gm)
    batch = inputs[0].shape[0]
    for count in (*range(2, batch + 1), batch + 1):  # one micro-batch is the step itself
        assert _outcome(micro.split, count, mixing=mixing) == _outcome(
            split_microbatches, gm, count, mixing=mixing)


def test_an_exact_split_is_propagated_once_for_every_count(monkeypatch):
    model, inputs = gpt.build(batch=8)
    gm = annotate(capture(model, inputs))
    calls = []
    monkeypatch.setattr(microbatches, "split_microbatches",
                        lambda gm, count, **kw: calls.append(count) or split_microbatches(
                            gm, count, **kw))
    micro = MicroBatches(model, inputs, gm)
    assert [micro.split(m).microbatches for m in (2, 4, 8, 2)] == [2, 4, 8, 2]
    assert calls == [8]
    pairs = _Pairs()
    pairs_gm = annotate(capture(pairs, (torch.randn(8, 4),)))
    calls.clear()
    micro = MicroBatches(pairs, (torch.randn(8, 4),), pairs_gm)
    assert micro.split(4).microbatches == 4
    with pytest.raises(autopar.MicrobatchError, match="mixes the samples"):
        micro.split(8)
    assert calls == [8, 4, 8]
