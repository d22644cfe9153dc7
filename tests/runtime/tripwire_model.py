"""A model file whose training loses a rank: GPT whose loss passes through an identity op
that ends the process (`os._exit`, as a dead device) on the last rank, at the `call`-th
forward of a run on `world` ranks (each process counts its own forwards). With `marker`
it writes that file as it dies: then only once, or with `lost`, at the first forward of
every later run on `world` ranks (the device stays dead)."""

from __future__ import annotations

import os

import torch
from torch import nn

from examples import gpt

_forwards = [0]


@torch.library.custom_op("autopar_tests::tripwire", mutates_args=())
def tripwire(loss: torch.Tensor, call: int, world: int, marker: str,
             lost: bool) -> torch.Tensor:
    _forwards[0] += 1
    size = int(os.environ.get("WORLD_SIZE", "1"))
    last = int(os.environ.get("RANK", "0")) == size - 1
    died = bool(marker) and os.path.exists(marker)
    if size == world and last and (_forwards[0] == call and not died or lost and died):
        if marker:
            open(marker, "w").close()
        os._exit(1)
    return loss.clone()


@tripwire.register_fake
def _(loss, call, world, marker, lost):
    return torch.empty_like(loss)


tripwire.register_autograd(lambda ctx, grad: (grad, None, None, None, None))


class Tripwired(nn.Module):
    def __init__(self, inner: nn.Module, call: int, world: int, marker: str,
                 lost: bool) -> None:
        super().__init__()
        self.inner, self.call, self.world = inner, call, world
        self.marker, self.lost = marker, lost

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return tripwire(self.inner(idx, targets), self.call, self.world, self.marker,
                        self.lost)


def build(call: int = 0, world: int = 4, marker: str = "", lost: int = 0, seed: int = 0):
    model, inputs = gpt.build(batch=8, hidden=64, layers=2, seed=seed)
    return Tripwired(model, call, world, marker, bool(lost)), inputs
