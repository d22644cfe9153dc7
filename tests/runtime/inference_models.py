"""Tiny Hugging Face `transformers` models as they serve, built from configs (no download).

`build(name, seed=0)` returns `(model, inputs)` where `model(*inputs)` returns the model's
output tensor (logits, or the encoder's last hidden state): no loss. Weights are the
model's own initialisation under `torch.manual_seed(seed)`; the inputs are drawn from
`seed`. The models (`MODELS`) are sized so that their weights outweigh one forward's
activations several times over (a vocabulary and width larger than the batch's tokens), as
a served model's do: a memory budget below the weights then forces them to shard.

- "llama": LlamaForCausalLM (rotary positions, grouped-query attention, SwiGLU);
- "qwen2": Qwen2ForCausalLM (Llama's layout with biased q, k, v projections);
- "mixtral": MixtralForCausalLM, 4 experts, each token takes the top 2 (transformers'
  "batched_mm" experts, which torch.export traces; see `hf_models`), on 4 tokens;
- "bert": BertForMaskedLM over padded sequences (an attention mask);
- "vit": ViTForImageClassification on 32x32 images in 8x8 patches.
"""

from __future__ import annotations

import hf_models
import torch
from torch import nn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    ViTConfig,
    ViTForImageClassification,
)

VOCAB, WIDTH, BATCH, SEQ = 512, 128, 2, 8
MIXTRAL_VOCAB, MIXTRAL_TOKENS = 4096, (1, 4)


class Logits(nn.Module):
    """`forward(*inputs)` -> the wrapped model's `logits` (or first output) tensor."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.inner(*inputs)
        return out.logits if hasattr(out, "logits") else out[0]


def _decoder(config_class, model_class, **extra) -> nn.Module:
    return model_class(config_class(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        use_cache=False, attn_implementation="sdpa", **extra))


def _llama() -> nn.Module:
    return _decoder(LlamaConfig, LlamaForCausalLM)


def _qwen2() -> nn.Module:
    return _decoder(Qwen2Config, Qwen2ForCausalLM)


def _mixtral() -> nn.Module:
    # "batched_mm" gathers its expert's weights for every (token, chosen expert) pair: a
    # forward's activations outweigh the experts unless the tokens are few and the dense
    # weights (a larger vocabulary) large.
    return hf_models.mixtral(vocab=MIXTRAL_VOCAB, intermediate=128)


def _bert() -> nn.Module:
    return BertForMaskedLM(BertConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=2 * WIDTH, max_position_embeddings=64,
        attn_implementation="sdpa"))


def _vit() -> nn.Module:
    return ViTForImageClassification(ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=WIDTH, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=2 * WIDTH, num_labels=10,
        attn_implementation="sdpa"))


MODELS = {"llama": _llama, "qwen2": _qwen2, "mixtral": _mixtral, "bert": _bert, "vit": _vit}


def _inputs(name: str, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    if name == "vit":
        return (torch.randn(BATCH, 3, 32, 32, generator=generator),)
    if name == "mixtral":
        return (torch.randint(0, MIXTRAL_VOCAB, MIXTRAL_TOKENS, generator=generator),)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    if name != "bert":
        return (ids,)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[0, SEQ // 2:] = 0  # the first sequence is padded: the mask is real
    return ids, mask


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model `name` (a key of `MODELS`) returning its output tensor, and its inputs."""
    torch.manual_seed(seed)
    model = Logits(MODELS[name]())
    return model, _inputs(name, torch.Generator().manual_seed(seed))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters, each tied tensor once."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
