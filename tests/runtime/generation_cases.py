"""What `test_generation` runs on every rank: tiny transformers causal LMs with a static
cache (`autopar.CachedLM`) compiled for decoding, and `autopar.generate` over them."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import autopar
from autopar.values.placement import parse_placements, shard_count

VOCAB, BATCH, PROMPT, NEW = 256, 4, 16, 32
MAX_LEN = PROMPT + NEW
CONFIGS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def build(name: str) -> torch.nn.Module:
    """The causal LM `name`, in eval mode, its weights drawn from seed 0."""
    config_class, model_class = CONFIGS[name]
    torch.manual_seed(0)
    return model_class(config_class(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        attn_implementation="sdpa")).eval()


def prompt() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))


def one_device_peak(name: str) -> float:
    """The decode program's peak on one device: a budget below it makes the plan shard."""
    served = autopar.CachedLM(build(name), batch=BATCH, max_len=MAX_LEN)
    return autopar.plan(served, autopar.Mesh((1,), ("x",), hardware="cpu"),
                        (prompt()[:, :1], torch.tensor([0])), training=False).peak_memory_bytes


@dataclass(frozen=True)
class Generated:
    """One rank's generation of one model: its ids and transformers', whether sampling
    drew the tokens a single process draws, and its cache pieces against the plan's."""

    ids: list
    expected: list
    prefilled: list   # the ids generated with the prompt run by a prefill program
    shares_state: bool  # the prefill program holds the decode program's own tensors
    stages: int       # the decode plan's pipeline stages (1 without a pipeline)
    sampled_alike: bool
    pieces: dict      # cache buffer -> this rank's piece's element count
    whole: dict       # cache buffer -> the whole cache's element count
    shards: dict      # cache buffer -> how many pieces the plan cuts it into


def generate_all(rank: int, names: tuple[str, ...], budgets: dict, shape: tuple[int, ...],
                 axes: tuple[str, ...]) -> list[Generated]:
    mesh = autopar.Mesh(shape, axes, hardware="cpu")
    return [_generate(name, mesh, budgets[name]) for name in names]


def _generate(name: str, mesh: autopar.Mesh, budget: float) -> Generated:
    lm = build(name)
    reference = copy.deepcopy(lm)
    ids = prompt()
    served = autopar.CachedLM(lm, batch=BATCH, max_len=MAX_LEN)
    pipelined = "pp" in mesh.axis_names
    pm = autopar.compile(served, mesh, (ids[:, :1], torch.tensor([0])), training=False,
                         memory_budget=budget, time_limit=5.0,
                         pipeline=autopar.Pipeline() if pipelined else "auto")
    ours = autopar.generate(pm, ids, max_new_tokens=NEW)
    prefilled, shares = _prefilled(pm, served, ids)
    with torch.no_grad():
        expected = reference.generate(ids, max_new_tokens=NEW, do_sample=False,
                                      cache_implementation="static", pad_token_id=0)
    sampled = autopar.generate(pm, ids, max_new_tokens=8, do_sample=True, temperature=0.9,
                               generator=torch.Generator().manual_seed(3))
    single = _sampled_in_one_process(autopar.CachedLM(reference, batch=BATCH,
                                                      max_len=MAX_LEN), ids)
    names = {n.name: n for n in pm.plan.nodes}
    buffers = {name: b for name, b in pm.named_buffers()
               if name.endswith((".kv_cache_keys", ".kv_cache_values"))}
    cache = {name: names["b_" + name.replace(".", "_")] for name in buffers}
    return Generated(
        ours.tolist(), expected.tolist(), prefilled, shares,
        len(pm.plan.pipeline.stages) if pm.plan.pipeline else 1,
        torch.equal(sampled, single),
        {b: buffers[b].numel() for b in cache}, {b: _whole(served, b) for b in cache},
        {b: _pieces(n.output, mesh) for b, n in cache.items()})


def _prefilled(pm, served: autopar.CachedLM, ids: torch.Tensor) -> tuple[list, bool]:
    """The ids generated with the prompt run by `compile_prefill`'s program, and whether
    that program holds the decode program's own tensors."""
    prefill = autopar.compile_prefill(pm, served, PROMPT, time_limit=5.0)
    prefilled = autopar.generate(pm, ids, max_new_tokens=NEW, prefill=prefill)
    decode_state = dict(pm.named_parameters()) | dict(pm.named_buffers())
    shares = all(t is decode_state.get(name) for name, t in
                 (*prefill.named_parameters(), *prefill.named_buffers()) if name in decode_state)
    return prefilled.tolist(), shares


def _sampled_in_one_process(served: autopar.CachedLM, ids: torch.Tensor) -> torch.Tensor:
    """`generate`'s sampling, on the plain module."""
    generator, tokens = torch.Generator().manual_seed(3), [ids]
    with torch.no_grad():
        for t in range(ids.shape[1]):
            logits = served(ids[:, t:t + 1], torch.tensor([t]))
        for t in range(ids.shape[1], ids.shape[1] + 8):
            last = torch.softmax(logits[:, -1].float() / 0.9, dim=-1)
            tokens.append(torch.multinomial(last, 1, generator=generator))
            logits = served(tokens[-1], torch.tensor([t]))
    return torch.cat(tokens, dim=1)


def _whole(served: autopar.CachedLM, buffer: str) -> int:
    return dict(served.named_buffers())[buffer].numel()


def _pieces(output: str, mesh: autopar.Mesh) -> int:
    placements = parse_placements(output)
    count = 1
    for dim in range(4):
        count *= shard_count(placements, mesh.shape, dim)
    return count
