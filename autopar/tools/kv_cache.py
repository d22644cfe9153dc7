"""`CachedLM`: a transformers causal LM with a static KV cache held as buffers of its layers.

Wrapping a model in `CachedLM(lm, batch=B, max_len=L)` declares its KV cache to autopar:
transformers' `StaticCache` of L positions for B sequences, each layer's key and value
tensors (B, KV heads, L, head dim) registered as non-persistent buffers `kv_cache_keys`
and `kv_cache_values` of that layer's decoder block (`lm.model.layers[i]`; of a holder
module `kv[i]` for a model without that list). `forward(input_ids, cache_position)` runs T
tokens (B, T) at positions `cache_position` (T,), writes their keys and values into the
cache there and returns the logits (B, T, vocab), as transformers' own generation with
that cache does.

Compiled with `training=False`, the cache is state of the plan like a weight: planned with
a placement of its own (by batch, by KV heads, or whole), counted in memory, and updated in
place on the rank that holds it (`passes/capturing/write_back.py`). Held by the blocks, a
layer's cache is block state like its weights: identical blocks stay identical, so they
are captured and planned as one (`repeat_blocks`, `fold_depth`). Each forward points the
cache's layers at the buffers (torch.export substitutes a module's buffers, not tensors
other objects hold) and at `cache_position`, where they write: every block reads the
same positions, the model's input, rather than a counter of its own.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import nn

from autopar.errors import GenerationError

KEYS, VALUES = "kv_cache_keys", "kv_cache_values"


class CachedLM(nn.Module):
    """`lm` (a transformers causal LM: a `config` with attention heads and hidden size)
    with a static cache of `max_len` positions for `batch` sequences (module docstring).
    Registers the cache's buffers on `lm`'s decoder blocks."""

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
        self.cache.layers = [_positioned(layer) for layer in self.cache.layers]
        blocks = getattr(getattr(lm, "model", None), "layers", None)
        if not (isinstance(blocks, nn.ModuleList) and len(blocks) == len(self.cache.layers)):
            self.kv = blocks = nn.ModuleList(nn.Module() for _ in self.cache.layers)
        self.holders = list(blocks)  # registered under `lm` or `kv`: a plain list here
        for holder, layer in zip(self.holders, self.cache.layers):
            holder.register_buffer(KEYS, layer.keys, persistent=False)
            holder.register_buffer(VALUES, layer.values, persistent=False)

    @contextlib.contextmanager
    def resized(self, batch: int) -> Iterator[CachedLM]:
        """A `CachedLM` of the same `lm` and `max_len` with a cache for `batch` sequences,
        on the device of `lm`'s weights, for the block's duration; this one's buffers are
        back in `lm`'s blocks after it (the throughput search plans one per batch it tries,
        `autopar.planning.throughput`)."""
        if batch == self.batch:
            yield self
            return
        held = [(holder, getattr(holder, KEYS), getattr(holder, VALUES))
                for holder in self.holders]
        try:
            yield CachedLM(self.lm, batch=batch, max_len=self.max_len)
        finally:
            for holder, keys, values in held:
                holder.register_buffer(KEYS, keys, persistent=False)
                holder.register_buffer(VALUES, values, persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        for holder, layer in zip(self.holders, self.cache.layers):
            layer.keys, layer.values = getattr(holder, KEYS), getattr(holder, VALUES)
            layer.positions, layer.cumulative_length = cache_position, cache_position[0]
        return self.lm(input_ids=input_ids, cache=self.cache, cache_position=cache_position,
                       use_cache=True).logits


def _positioned(layer: object) -> object:
    """`layer` (a `StaticLayer`, initialised) as one writing at the positions it is given."""
    positioned_class = _positioned_class()
    positioned = positioned_class.__new__(positioned_class)
    positioned.__dict__.update(vars(layer))
    return positioned


@functools.cache
def _positioned_class() -> type:
    """transformers' `StaticLayer` writing at `positions` (set by `CachedLM.forward`)
    rather than after a counter of its own (transformers is imported only when used)."""
    from transformers.cache_utils import StaticLayer

    class PositionedLayer(StaticLayer):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
                   *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
            self.keys.index_copy_(2, self.positions, key_states)
            self.values.index_copy_(2, self.positions, value_states)
            return self.keys, self.values

    return PositionedLayer


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
