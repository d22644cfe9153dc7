"""`CachedLM`: a transformers causal LM with a static KV cache held as its own buffers.

Wrapping a model in `CachedLM(lm, batch=B, max_len=L)` declares its KV cache to autopar:
transformers' `StaticCache` of L positions for B sequences, its layers' key and value
tensors registered as the module's buffers `cache_keys_{i}` and `cache_values_{i}`
(B, KV heads, L, head dim). `forward(input_ids, cache_position)` runs T tokens (B, T) at
positions `cache_position` (T,), writes their keys and values into the cache there and
returns the logits (B, T, vocab), as transformers' own generation with that cache does.

Compiled with `training=False`, the cache is state of the plan like a weight: planned with
a placement of its own (by batch, by KV heads, or whole), counted in memory, and updated in
place on the rank that holds it (`passes/capturing/write_back.py`). Each forward re-points
the cache's layers at the module's buffers, so that a trace sees the buffers themselves
(torch.export substitutes a module's buffers, not tensors other objects hold) and a
compiled program's pieces are what the cache writes into.
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.errors import GenerationError

KEYS, VALUES, LENGTH = "cache_keys_{}", "cache_values_{}", "cache_length_{}"


class CachedLM(nn.Module):
    """`lm` (a transformers causal LM: a `config` with attention heads and key-value heads)
    with a static cache of `max_len` positions for `batch` sequences (module docstring)."""

    def __init__(self, lm: nn.Module, *, batch: int, max_len: int) -> None:
        super().__init__()
        config = _config_of(lm)
        for name, value in (("batch", batch), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise GenerationError(f"CachedLM's {name} must be a positive count",
                                      expected="an int >= 1", got=repr(value),
                                      fix="e.g. CachedLM(lm, batch=4, max_len=256)")
        from transformers.cache_utils import StaticCache

        self.lm, self.batch, self.max_len = lm, batch, max_len
        self.cache = StaticCache(config=config, max_cache_len=max_len)
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        parameter = next(lm.parameters())
        self.cache.early_initialization(batch, getattr(config, "num_key_value_heads", heads),
                                        head_dim, parameter.dtype, parameter.device)
        for i, layer in enumerate(self.cache.layers):
            self.register_buffer(KEYS.format(i), layer.keys, persistent=False)
            self.register_buffer(VALUES.format(i), layer.values, persistent=False)
            self.register_buffer(LENGTH.format(i), layer.cumulative_length, persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.cache.layers):
            layer.keys = getattr(self, KEYS.format(i))
            layer.values = getattr(self, VALUES.format(i))
            layer.cumulative_length = getattr(self, LENGTH.format(i))
            layer.cumulative_length.copy_(cache_position[0])
        return self.lm(input_ids=input_ids, cache=self.cache, cache_position=cache_position,
                       use_cache=True).logits


def _config_of(lm: nn.Module):
    config = getattr(lm, "config", None)
    if config is None or not hasattr(config, "num_attention_heads") \
            or not hasattr(config, "hidden_size"):
        raise GenerationError(
            "CachedLM wraps a transformers causal LM",
            expected="a model with a config naming its attention heads and hidden size "
                     "(e.g. LlamaForCausalLM, Qwen2ForCausalLM)",
            got=type(lm).__name__,
            fix="build the model with transformers from its config, or keep its cache "
                "yourself as buffers the forward updates in place")
    return config
