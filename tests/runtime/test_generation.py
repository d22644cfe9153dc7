"""Generation over a compiled static KV cache matches transformers' own, token for token.

Llama and Qwen2 (`generation_cases`) wrapped in `autopar.CachedLM` (batch 4, 48 cache
positions) are compiled for decoding with `training=False` on gloo meshes (2,), (2, 2),
and (2, 2) pipelined over its first axis (each stage's layers and their cache on its
ranks), under a budget of 0.6 of the one-device plan's peak (so the plan must split
something), and `autopar.generate` appends 32 greedy tokens to a 16-token prompt: on
every rank the ids equal `lm.generate(..., do_sample=False,
cache_implementation="static")`'s, and so do those generated with the prompt run by a
prefill program (`compile_prefill`, cut into the decode program's stages where it has
them), which holds the decode program's own weights and cache. Sampling with a seeded
generator draws on every rank what the plain module draws.
Each rank holds its piece of every cache buffer of its stages: the whole's elements over
the pieces the plan cuts it into, and the plan cuts the cache.
"""

from __future__ import annotations

import generation_cases as cases
import pytest
import torch

import autopar
from autopar.runtime.launch import launch

NAMES = tuple(cases.CONFIGS)
# "2x2pp": pipelined over pp (its stages' caches on their ranks, split over tp).
MESHES = {"2": ((2,), ("tp",)), "2x2": ((2, 2), ("dp", "tp")), "2x2pp": ((2, 2), ("pp", "tp"))}
BUDGET = 0.6


@pytest.fixture(scope="module", params=tuple(MESHES))
def generated(request):
    shape, axes = MESHES[request.param]
    budgets = {name: BUDGET * cases.one_device_peak(name) for name in NAMES}
    count = shape[0] * (shape[1] if len(shape) > 1 else 1)
    return launch(cases.generate_all, count, NAMES, budgets, shape, axes, timeout=900.0)


def test_greedy_tokens_equal_transformers_generate(generated):
    for rank, results in enumerate(generated):
        for name, one in zip(NAMES, results):
            assert one.ids == one.expected, (rank, name)
            assert len(one.ids[0]) == cases.PROMPT + cases.NEW


def test_a_prefill_program_shares_the_decoder_s_tensors_and_its_tokens(generated):
    for rank, results in enumerate(generated):
        for name, one in zip(NAMES, results):
            assert one.prefilled == one.expected, (rank, name)
            assert one.shares_state, (rank, name)


def test_sampling_draws_what_one_process_draws(generated):
    for rank, results in enumerate(generated):
        for name, one in zip(NAMES, results):
            assert one.sampled_alike, (rank, name)


def test_each_rank_holds_its_piece_of_the_cache(generated):
    for rank, results in enumerate(generated):
        for name, one in zip(NAMES, results):
            # Keys and values of two layers, of those of its stage in a pipeline.
            assert len(one.pieces) == 4 // one.stages, name
            for buffer, count in one.pieces.items():
                assert count * one.shards[buffer] == one.whole[buffer], (rank, name, buffer)
            assert max(one.shards.values()) > 1, (name, "the plan keeps the cache whole")


def _decoder() -> tuple[autopar.ParallelModule, autopar.CachedLM]:
    served = autopar.CachedLM(cases.build("llama"), batch=cases.BATCH, max_len=20)
    mesh = autopar.Mesh((1,), ("x",), hardware="cpu")
    return autopar.compile(served, mesh, (cases.prompt()[:, :1], torch.tensor([0])),
                           training=False, time_limit=5.0), served


def test_a_prefill_program_for_other_prompts_is_refused():
    pm, served = _decoder()
    prefill = autopar.compile_prefill(pm, served, 8, time_limit=5.0)
    with pytest.raises(autopar.GenerationError, match="another length"):
        autopar.generate(pm, cases.prompt(), max_new_tokens=2, prefill=prefill)
    with pytest.raises(autopar.GenerationError, match="prompt length from 1 to 20"):
        autopar.compile_prefill(pm, served, 21)


def test_generation_past_the_cache_is_refused_before_it_runs():
    pm, _ = _decoder()
    with pytest.raises(autopar.GenerationError, match="need 21 cache positions"):
        autopar.generate(pm, cases.prompt(), max_new_tokens=5)
    with pytest.raises(autopar.GenerationError, match="need 26 cache positions"):
        autopar.generate(pm, torch.zeros(cases.BATCH, 25, dtype=torch.long), max_new_tokens=1)
    with pytest.raises(autopar.GenerationError, match="batch"):
        autopar.generate(pm, cases.prompt()[:2], max_new_tokens=1)


def test_generate_refuses_a_training_plan_and_a_model_without_a_cache():
    mesh = autopar.Mesh((1,), ("x",), hardware="cpu")
    model = torch.nn.Linear(8, 8)
    inputs = (torch.randn(2, 8),)
    served = autopar.compile(model, mesh, inputs, training=False, time_limit=5.0)
    with pytest.raises(autopar.GenerationError, match="holds no KV cache"):
        autopar.generate(served, cases.prompt(), max_new_tokens=1)

    class Loss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x).sum()

    trained = autopar.compile(Loss(), mesh, inputs, time_limit=5.0)
    with pytest.raises(autopar.GenerationError, match="forward-only") as raised:
        autopar.generate(trained, cases.prompt(), max_new_tokens=1)
    assert "training=False" in str(raised.value)


def test_cached_lm_refuses_what_is_not_a_causal_lm():
    with pytest.raises(autopar.GenerationError, match="transformers causal LM"):
        autopar.CachedLM(torch.nn.Linear(4, 4), batch=1, max_len=8)
    with pytest.raises(autopar.GenerationError, match="max_len"):
        autopar.CachedLM(cases.build("llama"), batch=1, max_len=0)


def test_a_plan_states_its_cache_and_refuses_one_too_large():
    served = autopar.CachedLM(cases.build("llama"), batch=cases.BATCH, max_len=cases.MAX_LEN)
    mesh = autopar.Mesh((2,), ("tp",), hardware="cpu")
    inputs = (cases.prompt()[:, :1], torch.tensor([0]))
    whole = sum(b.numel() * b.element_size() for name, b in served.named_buffers()
                if name.endswith(("kv_cache_keys", "kv_cache_values")))
    plan = autopar.plan(served, mesh, inputs, training=False, time_limit=5.0)
    assert plan.kv_cache_tokens == cases.BATCH * cases.MAX_LEN
    assert whole / 2 <= plan.kv_cache_bytes <= whole
    text = autopar.summary(plan)
    assert "KV cache" in text and "tokens in all" in text and "per output token" in text
    with pytest.raises(autopar.InfeasiblePlanError, match="KV cache of") as raised:
        autopar.plan(served, mesh, inputs, training=False, memory_budget=whole / 4,
                     time_limit=5.0)
    assert "per device for a cache of" in str(raised.value)
    assert "max_len" in str(raised.value)
