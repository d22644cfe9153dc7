"""`autopar generate FILE.py`: decode with a causal LM on a mesh of local gloo processes.

FILE.py's `build(**config)` returns `(lm, prompt_ids)`: a transformers causal LM and the
prompt's token ids (B, P). The parent loads it once (a bad file, prompt or length fails
before any rank starts), then `--nproc` ranks each wrap the model in `autopar.CachedLM`
(batch B, `--max-len` positions, by default P plus the new tokens), compile its decode
program with `training=False` and its prefill program (`autopar.compile_prefill`), and run
`autopar.generate`. Rank 0's ids are printed with the output tokens per second, and the
plans' predicted time to first token and per output token beside the measured ones; with
`--verify`, whether the ids equal transformers' own `generate` with a static cache (greedy
only). A mesh of one device runs in this process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import click

from autopar.cli.options import axis_names as parse_axis_names
from autopar.cli.options import config, mesh_shape, model_options, process_count
from autopar.errors import AutoparError, GenerationError

LAUNCH_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class GenerationRun:
    """What every rank needs to generate (picklable: it crosses to the ranks)."""

    model_file: str
    settings: tuple[tuple[str, object], ...]
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    hardware: str
    memory_budget: float | None
    time_limit: float
    max_new_tokens: int
    max_len: int
    sample: bool
    temperature: float
    seed: int
    verify: bool


@dataclass(frozen=True)
class Generated:
    """Rank 0's generation: the ids (prompt, then the new tokens), the prompt's length, the
    seconds of the whole generation and of one prefill call (the time to first token), the
    plans' predicted time to first token and per output token, and (with --verify) whether
    transformers agrees."""

    ids: list
    prompt_length: int
    seconds: float
    prefill_s: float
    predicted_first_s: float
    predicted_per_token_s: float
    verified: bool | None

    @property
    def new_tokens(self) -> int:
        return len(self.ids[0]) - self.prompt_length

    @property
    def per_token_s(self) -> float:
        """Measured seconds per output token after the first: the generation's time less
        a prefill call's, over the decode calls (one per new token but the last)."""
        return (self.seconds - self.prefill_s) / max(self.new_tokens - 1, 1)


def generate_rank(rank: int, run: GenerationRun) -> Generated | None:
    """Compile and generate on this rank; rank 0 reports (module docstring)."""
    import torch

    from autopar.compiler import compile as compile_model
    from autopar.tools.generate import compile_prefill, generate
    from autopar.tools.kv_cache import CachedLM
    from autopar.values.mesh import Mesh

    lm, prompt = _loaded(run)
    lm.eval()
    served = CachedLM(lm, batch=prompt.shape[0], max_len=run.max_len)
    pm = compile_model(served, Mesh(run.shape, run.axes, hardware=run.hardware),
                       (prompt[:, :1], torch.tensor([0])), training=False,
                       memory_budget=run.memory_budget, time_limit=run.time_limit)
    prefill = compile_prefill(pm, served, prompt.shape[1], time_limit=run.time_limit)
    with torch.no_grad():
        start = time.perf_counter()
        prefill(prompt, torch.arange(prompt.shape[1]))
        first = time.perf_counter() - start
    generator = torch.Generator().manual_seed(run.seed) if run.sample else None
    start = time.perf_counter()
    ids = generate(pm, prompt, run.max_new_tokens, do_sample=run.sample,
                   temperature=run.temperature, generator=generator, prefill=prefill)
    seconds = time.perf_counter() - start
    if rank != 0:
        return None
    verified = None
    if run.verify:
        with torch.no_grad():
            expected = lm.generate(prompt, max_new_tokens=run.max_new_tokens,
                                   do_sample=False, cache_implementation="static",
                                   pad_token_id=0)
        verified = bool(torch.equal(ids, expected))
    return Generated(ids.tolist(), prompt.shape[1], seconds, first,
                     prefill.plan.step_time_s, pm.plan.step_time_s, verified)


def _loaded(run: GenerationRun) -> tuple:
    """The model file's (lm, prompt ids): its inputs, a tuple of one, unwrapped."""
    from autopar.tools.model_file import load_model_file

    lm, inputs = load_model_file(run.model_file, **dict(run.settings))
    return lm, inputs[0] if isinstance(inputs, tuple) and len(inputs) == 1 else inputs


def _checked(run: GenerationRun) -> GenerationRun:
    """`run` with its cache length settled, after loading the model file here: the
    errors a rank would raise, raised before any starts."""
    import torch

    _, prompt = _loaded(run)
    if not isinstance(prompt, torch.Tensor) or prompt.ndim != 2 or prompt.dtype != torch.long:
        raise GenerationError("build() must return (lm, prompt_ids)",
                              expected="token ids of shape (batch, prompt length), int64",
                              got=repr(getattr(prompt, "shape", type(prompt).__name__)),
                              fix="return the prompt as a LongTensor (B, P)")
    needed = prompt.shape[1] + run.max_new_tokens
    max_len = run.max_len or needed
    if needed > max_len:
        raise GenerationError(f"the prompt and the new tokens need {needed} cache positions",
                              expected=f"at most --max-len {max_len}", got=str(needed),
                              fix="raise --max-len or lower --max-new-tokens")
    if run.sample and run.verify:
        raise GenerationError("--verify compares greedy decoding", expected="one of them",
                              got="--sample and --verify", fix="drop --sample or --verify")
    return GenerationRun(**{**run.__dict__, "max_len": max_len})


def _report(result: Generated, batch_shown: int = 2) -> None:
    tokens = len(result.ids) * result.new_tokens
    click.echo(f"generated {len(result.ids)} x {result.new_tokens} tokens in "
               f"{result.seconds:.2f} s: "
               f"{tokens / result.seconds:.1f} output tokens/s")
    click.echo(f"time to first token (the prompt's prefill): predicted "
               f"{result.predicted_first_s * 1e3:.3f} ms, measured {result.prefill_s * 1e3:.3f} ms")
    click.echo(f"per output token (a decode call): predicted "
               f"{result.predicted_per_token_s * 1e3:.3f} ms, measured "
               f"{result.per_token_s * 1e3:.3f} ms (mean of {max(result.new_tokens - 1, 1)})")
    for i, ids in enumerate(result.ids[:batch_shown]):
        click.echo(f"sequence {i}: {ids}")
    if result.verified is not None:
        click.echo("verify: " + ("identical to transformers' generate (static cache)"
                                 if result.verified else "DIFFERS from transformers' generate"))


@click.command("generate")
@click.argument("model_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--nproc", type=int, default=None, help="processes (default: the mesh size)")
@model_options(mesh="2", hardware="cpu", time_limit=10.0)
@click.option("--max-new-tokens", type=int, default=32, show_default=True)
@click.option("--max-len", type=int, default=None,
              help="cache positions (default: the prompt's length plus the new tokens)")
@click.option("--sample", is_flag=True, help="draw tokens from the softmax instead of argmax")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="the sampling seed")
@click.option("--verify", is_flag=True,
              help="check the ids against transformers' generate (greedy, static cache)")
def generate_command(model_file, nproc, mesh_text, axis_names, hardware, memory_budget,
                     time_limit, settings, max_new_tokens, max_len, sample, temperature,
                     seed, verify) -> None:
    """Generate with MODEL_FILE (build() -> (causal LM, prompt ids)) on a mesh."""
    from autopar.runtime.launch import launch

    shape = mesh_shape(mesh_text)
    size = process_count(nproc, shape, mesh_text)
    try:
        run = _checked(GenerationRun(
            model_file, tuple(config(settings).items()), shape,
            parse_axis_names(axis_names, len(shape)), hardware, memory_budget, time_limit,
            max_new_tokens, max_len or 0, sample, temperature, seed, verify))
        result = generate_rank(0, run) if size == 1 else launch(
            generate_rank, size, run, timeout=LAUNCH_TIMEOUT_S)[0]
    except AutoparError as exc:
        raise click.ClickException(str(exc)) from exc
    _report(result)
    if result.verified is False:
        raise SystemExit(1)
