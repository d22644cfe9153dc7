"""`PendingSum`: an output whose all-reduce finishes in the background waits for its value
exactly when something reads it, and never for the backward's seed gradient."""

from __future__ import annotations

import pytest
import torch

from autopar.runtime import pending
from autopar.runtime.pending import PendingSum


class _FakeWork:
    """An all-reduce in flight: `wait()` finishes it by writing the sum into the buffer."""

    def __init__(self, buffer: torch.Tensor, total: torch.Tensor) -> None:
        self.buffer, self.total, self.waits = buffer, total, 0

    def wait(self) -> bool:
        self.waits += 1
        self.buffer.copy_(self.total)
        return True


def _pending(local: float, total: float) -> tuple[PendingSum, _FakeWork]:
    buffer = torch.tensor(local)
    work = _FakeWork(buffer, torch.tensor(total))
    return PendingSum(buffer, work), work


def test_reading_the_value_waits_once() -> None:
    value, work = _pending(1.0, 3.0)
    assert work.waits == 0
    assert float(value) == 3.0
    assert (value * 2).item() == 6.0
    assert type(value * 2) is torch.Tensor  # results are plain tensors
    assert work.waits == 1


@pytest.mark.parametrize("read", [repr, lambda t: t + 0, torch.Tensor.item,
                                  lambda t: torch.stack([t, t])])
def test_every_read_sees_the_sum(read) -> None:
    value, _ = _pending(1.0, 3.0)
    assert "3." in repr(read(value))


def test_shape_only_ops_and_detach_do_not_wait() -> None:
    value, work = _pending(1.0, 3.0)
    assert torch.ones_like(value).item() == 1.0
    assert torch.zeros_like(value).item() == 0.0
    assert torch.empty_like(value).shape == ()
    detached = value.detach()
    assert isinstance(detached, PendingSum)
    assert work.waits == 0
    assert detached.item() == 3.0  # the alias waits on the same all-reduce
    assert value.item() == 3.0


def test_backward_runs_before_the_sum_arrives(monkeypatch) -> None:
    works: list[_FakeWork] = []

    def all_reduce(buffer, group=None, async_op=False):
        assert async_op, "the output's all-reduce must not block"
        works.append(_FakeWork(buffer, buffer * 2))  # two ranks holding the same summand
        return works[-1]

    monkeypatch.setattr(pending.dist, "all_reduce", all_reduce)
    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    local = (weight * 3).sum()
    loss = pending._ReduceOutput.apply(local, None)
    assert isinstance(loss, PendingSum) and loss.requires_grad
    loss.backward()
    assert works[0].waits == 0, "the backward waited for the loss's value"
    # R -> P backward: each rank's summand receives the whole gradient.
    assert torch.equal(weight.grad, torch.tensor([3.0, 3.0]))
    assert loss.item() == 18.0
    assert local.item() == 9.0, "the all-reduce ran on the summand itself, not a copy"
