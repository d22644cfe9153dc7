"""`generate`: greedy or sampled decoding over a compiled `CachedLM`, as transformers' does.

`pm = autopar.compile(CachedLM(lm, batch=B, max_len=L), mesh, (ids, position),
training=False)` with `ids` of shape (B, 1) and `position` of shape (1,) compiles the
decode program: one token per sequence at a cache position. `generate(pm, input_ids,
max_new_tokens=N)` feeds the prompt (B, P) through it one position at a time (filling
the cache), then appends N tokens, each the argmax of the last logits (or, with
`do_sample`, drawn from their softmax at `temperature` with `generator`), and returns the
(B, P + N) ids, as `lm.generate(input_ids, max_new_tokens=N, do_sample=False,
cache_implementation="static")` does. Every rank calls it alike; the outputs are whole on
every rank, so each draws the same tokens (give every rank a generator seeded alike).

A prefill program runs the whole prompt in one call: `compile_prefill(pm, served, P)`
compiles `served` at P tokens with every weight and cache buffer pinned where the decode
program `pm` placed it, and shares `pm`'s tensors (the weights and the cache are stored
once); `generate(pm, ids, N, prefill=that)` then fills the cache with it. Its plan's
latency is the predicted time to first token, the decode plan's the time per output token.

The loop is the caller's if they prefer: `pm(ids[:, t:t + 1], torch.tensor([t]))` returns
the logits of position t and writes its keys and values into the cache at t.
"""

from __future__ import annotations

import torch

from autopar.errors import GenerationError
from autopar.planning.prefill import pinned_state, prefill_layout
from autopar.runtime.parallel_module import ParallelModule
from autopar.runtime.pipeline import PipelinedModule
from autopar.tools.kv_cache import KEYS, CachedLM
from autopar.values.specs import TensorSpec


def generate(pm: ParallelModule | PipelinedModule, input_ids: torch.Tensor, max_new_tokens: int, *,
             do_sample: bool = False, temperature: float = 1.0,
             generator: torch.Generator | None = None,
             prefill: ParallelModule | PipelinedModule | None = None) -> torch.Tensor:
    """The prompt `input_ids` (B, P) and `max_new_tokens` tokens after it (module
    docstring), the prompt run by `prefill` when given. Raises `GenerationError`, before
    anything runs, for a program that is not a forward-only `CachedLM` decoding one token,
    a batch other than the cache's, a prompt and new tokens longer than the cache, or a
    prefill program of another prompt length or of other tensors than `pm`'s."""
    batch, length = _check(pm, input_ids, max_new_tokens, temperature)
    if prefill is not None:
        _check_prefill(pm, prefill, length)
    tokens = [input_ids]
    with torch.no_grad():
        if prefill is not None:
            logits = prefill(input_ids, torch.arange(length, device=input_ids.device))
        for t in range(0 if prefill is None else length, length):
            logits = pm(input_ids[:, t:t + 1], _position(t, input_ids))
        for t in range(length, length + max_new_tokens):
            last = logits[:, -1].float()
            if do_sample:
                chosen = torch.multinomial(torch.softmax(last / temperature, dim=-1), 1,
                                           generator=generator)
            else:
                chosen = last.argmax(dim=-1, keepdim=True)
            tokens.append(chosen.to(input_ids.dtype))
            if t + 1 < length + max_new_tokens:
                logits = pm(tokens[-1], _position(t, input_ids))
    return torch.cat(tokens, dim=1)


def compile_prefill(pm: ParallelModule | PipelinedModule, served: CachedLM,
                    prompt_length: int, *, time_limit: float = 30.0
                    ) -> ParallelModule | PipelinedModule:
    """The prefill program of `served` (the `CachedLM` `pm` was compiled from) at
    `prompt_length` tokens per sequence: planned with every weight and cache buffer pinned
    where `pm` placed it, cut into `pm`'s pipeline stages if it has them
    (`autopar.planning.prefill`), then holding `pm`'s own tensors, so that both programs
    share one copy of the weights and the cache. Collective, like `autopar.compile`."""
    from autopar.compiler import compile as compile_model

    batch, _, positions, _ = cache_shape(pm)
    if isinstance(prompt_length, bool) or not isinstance(prompt_length, int) \
            or not 1 <= prompt_length <= positions:
        raise GenerationError("a prefill program runs a prompt the cache can hold",
                              expected=f"a prompt length from 1 to {positions}",
                              got=repr(prompt_length), fix="pass the prompts' length")
    example = (torch.zeros(batch, prompt_length, dtype=torch.long),
               torch.arange(prompt_length))
    program = compile_model(served, pm.plan.mesh, example, training=False,
                            constraints=pinned_state(pm.plan), pipeline=prefill_layout(pm.plan),
                            time_limit=time_limit)
    program.adopt(dict(pm.named_parameters()) | dict(pm.named_buffers()))
    return program


def _check_prefill(pm: ParallelModule | PipelinedModule, prefill: object, length: int) -> None:
    ids = prefill.inputs[0] if isinstance(prefill, (ParallelModule, PipelinedModule)) else None
    if not isinstance(ids, TensorSpec) or ids.shape[1] != length:
        raise GenerationError("the prefill program runs prompts of another length",
                              expected=f"one compiled at {length} tokens per sequence",
                              got=f"one compiled at {ids}",
                              fix="compile_prefill(pm, served, prompt_length=P) for these "
                                  "prompts, or leave prefill out")
    mine = dict(pm.named_buffers())
    shared = all(t is mine.get(name) for name, t in prefill.named_buffers() if name in mine)
    if not shared:
        raise GenerationError("the prefill program holds a cache of its own",
                              expected="a prefill program sharing the decode program's "
                                       "tensors (compile_prefill)",
                              got="separate tensors", fix="build it with compile_prefill")


def _position(t: int, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor([t], dtype=torch.long, device=like.device)


def cache_shape(pm: object) -> tuple[int, ...]:
    """The global shape (batch, KV heads, positions, head dim) of `pm`'s cache; raises
    `GenerationError` unless `pm` is a forward-only compiled `CachedLM`."""
    compiled = isinstance(pm, (ParallelModule, PipelinedModule))
    if not compiled or pm.plan.training:
        raise GenerationError(
            "generate runs a forward-only compiled CachedLM",
            expected="autopar.compile(CachedLM(lm, batch=B, max_len=L), mesh, (ids, "
                     "position), training=False)",
            got=type(pm).__name__ if not compiled else "a training plan",
            fix="compile the model wrapped in autopar.CachedLM with training=False")
    slot = next((s for s in pm.slots if s.names[0].rsplit(".", 1)[-1] == KEYS), None)
    if slot is None:
        raise GenerationError("the compiled model holds no KV cache",
                              expected="a compiled autopar.CachedLM",
                              got=f"a compiled {pm.plan.model}",
                              fix="wrap the causal LM: autopar.CachedLM(lm, batch=B, max_len=L)")
    return slot.shape


def _check(pm: object, input_ids: object, max_new_tokens: object,
           temperature: object) -> tuple[int, int]:
    """(batch, prompt length) of a generation that can run; `GenerationError` otherwise."""
    batch, _, positions, _ = cache_shape(pm)
    ids = pm.inputs[0]
    if not isinstance(ids, TensorSpec) or ids.shape != (batch, 1):
        raise GenerationError("generate feeds the compiled program one token per sequence",
                              expected=f"a program compiled at ids of shape ({batch}, 1)",
                              got=f"one compiled at {ids}",
                              fix="compile with example inputs (ids[:, :1], torch.tensor([0]))")
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 \
            or input_ids.shape[0] != batch or input_ids.shape[1] < 1:
        raise GenerationError("the prompt must be token ids of the cache's batch",
                              expected=f"a tensor of shape ({batch}, P), P >= 1",
                              got=repr(getattr(input_ids, "shape", input_ids)),
                              fix="pass as many sequences as the CachedLM's batch")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < 1:
        raise GenerationError("max_new_tokens must be a positive count", expected="an int >= 1",
                              got=repr(max_new_tokens), fix="e.g. max_new_tokens=32")
    length = input_ids.shape[1]
    if length + max_new_tokens > positions:
        raise GenerationError(
            f"the prompt and the new tokens need {length + max_new_tokens} cache positions",
            expected=f"at most the cache's {positions} (prompt {length} + new "
                     f"{max_new_tokens})",
            got=f"{length + max_new_tokens}",
            fix="generate fewer tokens, or wrap the model with a larger max_len")
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise GenerationError("temperature must be positive", expected="e.g. 0.8",
                              got=repr(temperature), fix="pass temperature > 0")
    return batch, length
