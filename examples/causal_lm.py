"""A small transformers causal LM (Llama) and a prompt: what `autopar generate` decodes with.

    autopar generate examples/causal_lm.py --mesh 2 --max-new-tokens 32 --verify

`build(**config)` returns `(lm, prompt_ids)`: `LlamaForCausalLM` built from its config (no
download), its weights drawn from `seed`, in eval mode, and `batch` prompts of `prompt`
random token ids. Needs `transformers` (installed with the test extras).
"""

from __future__ import annotations

import torch
from torch import nn


def build(*, vocab: int = 256, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
          ffn: int = 128, layers: int = 2, batch: int = 4, prompt: int = 16, seed: int = 0,
          ) -> tuple[nn.Module, torch.Tensor]:
    """The causal LM and prompt token ids of shape (batch, prompt)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    lm = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
        attn_implementation="sdpa")).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    return lm, torch.randint(0, vocab, (batch, prompt), generator=generator)
