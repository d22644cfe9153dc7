"""Tiny Hugging Face `transformers` causal LMs, built from configs (nothing is downloaded).

`build(name, seed=0, batch=4, seq=16, **config)` returns `(model, (input_ids, labels))` where
`model(input_ids, labels)` returns the mean next-token loss, a scalar, like the examples, so
the equivalence harness (`equivalence_cases`) trains them. Weights are the model's own
initialisation drawn under `torch.manual_seed(seed)`; dropout is 0, no cache is kept, and
attention runs as `scaled_dot_product_attention` ("sdpa"). The models (`MODELS`):

- "gpt2": GPT2LMHeadModel, a dense decoder (learned positions, LayerNorm, GELU, Conv1D
  projections as addmm, input embedding tied to the output head);
- "mixtral": MixtralForCausalLM, a mixture of experts (rotary positions, grouped-query
  attention, RMSNorm, 4 experts of which each token takes the top 2).

Mixtral runs its experts with transformers' "batched_mm" implementation: each (token,
chosen expert) pair gathers its expert's weights and the pairs run as one batched matmul,
so every shape is static and torch.export traces it. The default ("eager") loops over the
experts that some token chose, a data-dependent loop that export rejects. Routing picks
the top-k router logits; `routing_margin` says how clearly.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    MixtralConfig,
    MixtralForCausalLM,
)
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

VOCAB = 256


class CausalLMLoss(nn.Module):
    """`forward(input_ids, labels)` -> the wrapped causal LM's mean next-token loss."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, labels=labels).loss


def _gpt2(vocab: int = VOCAB, heads: int = 4, width: int = 64) -> nn.Module:
    lm = GPT2LMHeadModel(GPT2Config(
        vocab_size=vocab, n_embd=width, n_layer=2, n_head=heads, n_positions=64,
        bos_token_id=vocab - 1, eos_token_id=vocab - 1, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=False, attn_implementation="sdpa"))
    # transformers picks the loss by class name, which this one does not match (it would
    # warn, then take the same causal-LM loss).
    lm.loss_type = "ForCausalLM"
    return lm


def mixtral(vocab: int = VOCAB, intermediate: int = 64) -> nn.Module:
    """The Mixtral of `MODELS` ("batched_mm" experts), of another vocabulary or expert
    width when asked."""
    return MixtralForCausalLM(MixtralConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=intermediate, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64, use_cache=False,
        attn_implementation="sdpa", experts_implementation="batched_mm"))


MODELS = {"gpt2": _gpt2, "mixtral": mixtral}


def build(name: str, seed: int = 0, batch: int = 4, seq: int = 16, **config,
          ) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The model `name` (a key of `MODELS`, built with `config`: `vocab`, and for GPT-2
    `heads` and `width`) with its loss as output, and its inputs: random token ids drawn
    from `seed`, which are also the labels (the loss shifts them)."""
    torch.manual_seed(seed)
    model = CausalLMLoss(MODELS[name](**config))
    generator = torch.Generator().manual_seed(seed)
    vocab = config.get("vocab", VOCAB)
    input_ids = torch.randint(0, vocab, (batch, seq), generator=generator)
    return model, (input_ids, input_ids.clone())


def routing_margin(model: nn.Module, inputs: tuple) -> float:
    """How clearly the routers of `model` choose on `inputs`: over every router and token,
    the least gap between the k-th and the (k+1)-th largest logit (k experts chosen), over
    the spread (standard deviation) of that router's logits. Rounding a split computation
    differently perturbs logits by about 1e-7 of their spread; a margin far above that
    means every rank's program routes each token to the same experts. inf without routers.
    """
    gaps: list[float] = []

    def record(router: nn.Module, args: tuple, output: tuple) -> None:
        logits = output[0].detach().float()
        top = logits.topk(router.top_k + 1, dim=-1).values
        gaps.append(float((top[:, -2] - top[:, -1]).min() / logits.std()))

    hooks = [module.register_forward_hook(record) for module in model.modules()
             if isinstance(module, MixtralTopKRouter)]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return min(gaps, default=float("inf"))
