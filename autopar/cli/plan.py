"""`autopar plan FILE.py`: plan a model file's `build()` on a mesh and print the summary.

Progress goes to stderr as it happens: one line per pass and per hand strategy's solve
(under a spinner on a terminal, with the solver's lines as the spinner's text; every line
when stderr is a file or a pipe). The summary, with the comparison against the hand
strategies unless `--no-hand-strategies`, goes to stdout; `--out` saves the plan as JSON and
`--report` writes its HTML report. Warnings raised while planning are the plan's (see
`autopar.planning.entry.plan_model`): the summary ends with each once, as a "warning:" line, rather
than as Python's warning lines; planning that fails prints them so on stderr.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click
from rich.console import Console

from autopar.cli.options import axis_names as parse_axis_names
from autopar.cli.options import (
    compression_names,
    config,
    hardware_kinds,
    mesh_shape,
    mesh_shares,
    microbatches,
    model_options,
    pipeline,
)
from autopar.errors import AutoparError


@contextmanager
def progress_lines() -> Iterator[Callable[[str], None]]:
    """A progress callback: a spinner over the stage lines on a terminal, plain lines else."""
    from autopar.planning.graph import STAGE

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda message: click.echo(f"... {message}", err=True)
        return
    with console.status("planning") as status:
        def show(message: str) -> None:
            if message.startswith(STAGE):
                console.print(f"... {message}", highlight=False, markup=False)
            status.update(message)
        yield show


@click.command("plan")
@click.argument("model_file", type=click.Path())
@model_options(mesh="8", hardware="h100-sxm", time_limit=30.0)
@click.option("--hand-strategies/--no-hand-strategies", default=True, show_default=True,
              help="also cost data parallel, ZeRO-3, Megatron and data x tensor parallel")
@click.option("--microbatches", "microbatch_text", default="auto", show_default=True,
              help="micro-batches per step (gradient accumulation), or auto")
@click.option("--pipeline", "pipeline_text", default="auto", show_default=True,
              help="pipeline over the axis named pp: auto, off, or SCHEDULE[:MICROBATCHES] "
                   "(GPipe, 1F1B, Interleaved1F1B), e.g. 1F1B:8")
@click.option("--inference", is_flag=True,
              help="plan the forward alone, as the model serves (training=False): no loss, "
                   "backward or optimizer state")
@click.option("--sharded-outputs", is_flag=True,
              help="with --inference: leave the outputs split as the plan chooses "
                   "(outputs='sharded'), not gathered whole on every device")
@click.option("--prefill", type=int, default=None,
              help="with --inference, for a decode program (an autopar.CachedLM fed one "
                   "token): also plan its prefill of this many prompt tokens, to predict the "
                   "time to first token")
@click.option("--objective", type=click.Choice(["latency", "throughput"]), default="latency",
              show_default=True,
              help="with --inference: the step's latency at the given batch, or (a CachedLM "
                   "on the meta device) the batch and plan serving the most tokens a second")
@click.option("--shares", "shares_text", default=None,
              help="how each axis cuts: 'even' (DTensor's chunks), or per axis, "
                   "comma-separated, '-' or the weights of its indices (3:3:1:1); by default "
                   "an axis whose kinds differ is cut by their speed")
@click.option("--compression", "compression_text", default=None,
              help="let the solver compress: 'auto', or comma-separated names "
                   "(bf16-reduce, int8-gather, hpz, powersgd, powersgd-R); by default nothing "
                   "is compressed")
@click.option("--out", type=click.Path(), default=None, help="write the plan as JSON")
@click.option("--report", "report_out", type=click.Path(), default=None,
              help="write the plan's HTML report (see `autopar report`)")
def plan_command(model_file, mesh_text, axis_names, hardware, memory_budget, time_limit,
                 settings, hand_strategies, microbatch_text, pipeline_text, inference,
                 sharded_outputs, prefill, objective, shares_text, compression_text, out,
                 report_out) -> None:
    """Plan MODEL_FILE (a .py file with build() -> (model, example_inputs))."""
    from autopar.planning.entry import plan
    from autopar.present.report import write_report
    from autopar.present.summary import render_summary
    from autopar.tools.model_file import load_model_file
    from autopar.values.mesh import Mesh

    shape, count = mesh_shape(mesh_text), microbatches(microbatch_text)
    layout = pipeline(pipeline_text)
    caught: list[warnings.WarningMessage] = []
    try:
        mesh = Mesh(shape, parse_axis_names(axis_names, len(shape)), hardware_kinds(hardware),
                    shares=mesh_shares(shares_text, len(shape)))
        model, inputs = load_model_file(model_file, **config(settings))
        with progress_lines() as progress, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = plan(model, mesh, inputs, memory_budget=memory_budget,
                          time_limit=time_limit, hand_strategies=hand_strategies,
                          microbatches=count, pipeline=layout, training=not inference,
                          outputs="sharded" if sharded_outputs else "whole", prefill=prefill,
                          objective=objective, compression=compression_names(compression_text),
                          progress=progress)
    except AutoparError as exc:
        for message in dict.fromkeys(str(w.message) for w in caught):
            click.echo(f"warning: {message}", err=True)
        raise click.ClickException(str(exc)) from exc
    click.echo(render_summary(result))
    if out:
        result.save(out)
        click.echo(f"plan written to {out}")
    if report_out:
        try:
            written = write_report(result, report_out)
        except AutoparError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f"report written to {written}")
