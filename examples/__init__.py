"""Runnable example models; each module has `build(**config) -> (model, example_inputs)`."""

from __future__ import annotations

import torch
from torch import nn


def init_weights(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Initialise `model` deterministically from `seed`, GPT-2 style.

    Linear and embedding weights ~ N(0, std), biases zero, norm weights one. A private
    generator keeps the global RNG untouched. Meta-device models have no storage, so there
    is nothing to initialise.
    """
    if any(param.is_meta for param in model.parameters()):
        return
    norms = (nn.LayerNorm, nn.RMSNorm)
    ones = {id(m.weight) for m in model.modules() if isinstance(m, norms) and m.weight is not None}
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # named_parameters order is fixed by the module tree, so the draw order is too.
        for _, param in model.named_parameters():
            if param.ndim >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
            elif id(param) in ones:
                param.fill_(1.0)
            else:
                param.zero_()


def random_tokens(shape: tuple[int, ...], vocab: int, seed: int, device: str) -> torch.Tensor:
    """Token ids drawn from `seed`; an empty meta tensor when `device` is "meta"."""
    if torch.device(device).type == "meta":
        return torch.empty(shape, dtype=torch.long, device="meta")
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=generator).to(device)


def random_floats(shape: tuple[int, ...], seed: int, device: str,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard-normal values drawn from `seed`; an empty meta tensor on "meta"."""
    if torch.device(device).type == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
