"""`autopar run FILE.py`: train a model file on a mesh of local gloo processes.

The parent process plans (so a bad model file, mesh or budget fails before any rank
starts), launches `--nproc` ranks with `autopar.launch` and follows rank 0's steps as they
complete: rank 0 sends each `StepRecord` through a pipe that a thread of the parent reads,
printing a line per step under a progress bar (shown on terminals only); a mesh of one
device trains in this process. At the end it prints rank 0's communication against the
plan and, with `--verify`, whether every step matched the single-process model.

With `--measure`, every rank then compiles the model again under the same plan and
measures `--steps` more steps (`autopar.measure`: 2 warm-up steps, the timed ones, one
profiled), and the parent prints the plan's predictions against the measurements: step
time (median, spread), op groups, and each rank's peak memory.

With `--checkpoint-dir`, the ranks checkpoint every `--checkpoint-every` steps and after
the last (`autopar.checkpoint`), and when a rank dies the parent launches them again from
the latest committed checkpoint, up to `--max-restarts` times. A size that fails twice in a
row without a new checkpoint has lost a device: with `--min-nproc` below it, the run goes
on with half the processes, planned again for a one-axis mesh of them ("dp").
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable

import click

from autopar.cli.options import axis_names as parse_axis_names
from autopar.cli.options import (
    compression_names,
    config,
    measured_steps,
    mesh_shape,
    microbatches,
    pipeline,
    process_count,
)
from autopar.errors import AutoparError
from autopar.tools.training import (
    ABSOLUTE_TOLERANCE,
    BF16_TOLERANCE,
    LEARNING_RATE,
    PRECISIONS,
    TOLERANCE,
    VERIFY_LEARNING_RATE,
    RankReport,
    StepRecord,
    Tolerance,
    TrainingRun,
    communication_report,
    format_step,
    train_rank,
    verification_failures,
)

# A rank that fails stops the others within gloo's timeout; an hour bounds a stuck run.
LAUNCH_TIMEOUT_S = 3600.0


@dataclasses.dataclass(frozen=True)
class Trained:
    """What a run brings back: rank 0's report, and with `--measure` every rank's
    measurement in rank order (else empty)."""

    report: RankReport
    measured: tuple = ()


def _trained(rank: int, run: TrainingRun, measure: bool,
             on_step: Callable[[StepRecord], None] | None) -> tuple:
    """Train `run` on this rank, then with `measure` measure it (collective)."""
    from autopar.tools.measure import measure_run

    report = train_rank(rank, run, on_step=on_step)
    return report, measure_run(run) if measure else None


def _rank_main(rank: int, run: TrainingRun, steps_out, measure: bool = False) -> tuple:
    """One rank under `launch`: (its report, its measurement or None). Rank 0 sends each
    step's record to the parent through `steps_out`, the write end of a pipe (a send is in
    the pipe when it returns, so every record has arrived by the time `launch` returns)."""
    return _trained(rank, run, measure, steps_out.send if rank == 0 else None)


def _follow(steps_in, done: threading.Event, show: Callable[[StepRecord], None]) -> None:
    """Show the records arriving on `steps_in` until `done` is set and the pipe is empty."""
    while True:
        finished = done.is_set()  # read before polling: nothing arrives after it is set
        if steps_in.poll(0.1):
            show(steps_in.recv())
        elif finished:
            return


def _progress_bar(description: str, steps: int):
    """A transient rich progress bar on terminals (it stays below the step lines and goes
    at the end); None elsewhere (pipes, tests), where the step lines are the progress."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console()
    if not console.is_terminal:
        return None
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        console=console, transient=True)
    progress.add_task(description, total=steps)
    return progress


def _launch(run: TrainingRun, nproc: int, show: Callable[[StepRecord], None],
            measure: bool) -> Trained:
    """Launch the ranks, `show` rank 0's steps as they complete; rank 0's report and, with
    `measure`, every rank's measurement."""
    import torch.multiprocessing as mp

    from autopar.runtime.launch import launch

    # A pipe rather than a queue: no feeder thread to flush before a rank exits (launch
    # ends ranks without interpreter teardown), and no semaphores to release.
    steps_in, steps_out = mp.get_context("spawn").Pipe(duplex=False)
    done = threading.Event()
    follower = threading.Thread(target=_follow, args=(steps_in, done, show), daemon=True)
    follower.start()
    try:
        results = launch(_rank_main, nproc, run, steps_out, measure,
                         timeout=LAUNCH_TIMEOUT_S)
    finally:
        done.set()
        follower.join(timeout=10.0)
        steps_in.close()
        steps_out.close()
    return Trained(results[0][0], tuple(m for _, m in results if m is not None))


def _train(run: TrainingRun, nproc: int, measure: bool = False) -> Trained:
    """Train on `nproc` processes (in this one for a mesh of one device, which needs no
    process group), printing each step, then with `measure` measure them."""
    progress = _progress_bar(f"training on {nproc} processes", run.steps)

    def show(record: StepRecord) -> None:
        click.echo(format_step(record, run.steps))
        if progress is not None:
            progress.advance(progress.task_ids[0])

    with progress or contextlib.nullcontext():
        if nproc == 1:
            report, measured = _trained(0, run, measure, show)
            return Trained(report, (measured,) if measured is not None else ())
        return _launch(run, nproc, show, measure)


def _recovering(run: TrainingRun, nproc: int, planned: Callable[[TrainingRun], TrainingRun],
                *, max_restarts: int, min_nproc: int, measure: bool = False
                ) -> tuple[TrainingRun, Trained]:
    """`_train`, launched again from the latest checkpoint when a rank dies (see the module
    docstring); the run that finished (planned again if it lost processes) and what it
    brought back. `planned` plans a run again."""
    from autopar.runtime.errors import LaunchError
    from autopar.tools import checkpoint

    failed_at: dict[int, list] = {}  # processes -> the latest checkpoint at each failure
    attempt = 0
    while True:
        try:
            return run, _train(run, nproc, measure)
        except LaunchError as error:
            if run.checkpoint_dir is None or attempt == max_restarts or nproc == 1:
                raise
            attempt += 1
            latest = checkpoint.latest(run.checkpoint_dir)
            failures = failed_at.setdefault(nproc, [])
            failures.append(latest)
            click.echo(f"a rank failed ({str(error).splitlines()[0]}); "
                       f"restart {attempt} of {max_restarts}", err=True)
            if len(failures) >= 2 and failures[-1] == failures[-2] and nproc // 2 >= min_nproc:
                nproc //= 2  # no progress at this size twice: a device is gone
                run = planned(dataclasses.replace(run, mesh=(nproc,), axis_names=("dp",),
                                                  plan=None))
            click.echo(f"resuming from {latest.name if latest else 'the start'} on {nproc} "
                       + ("process" if nproc == 1 else "processes"), err=True)
            run = dataclasses.replace(run, resume=True)


@click.command("run")
@click.argument("model_file", type=click.Path())
@click.option("--nproc", type=int, default=None, help="processes (default: the mesh size)")
@click.option("--mesh", "mesh_text", default="2", show_default=True, help="mesh shape, e.g. 2x2")
@click.option("--axis-names", default=None, help="comma-separated axis names (default dp,tp,..)")
@click.option("--hardware", default="cpu", show_default=True, help="profile to plan for")
@click.option("--steps", type=int, default=5, show_default=True, help="AdamW steps")
@click.option("--lr", type=float, default=None,
              help=f"learning rate (default {LEARNING_RATE:g}, {VERIFY_LEARNING_RATE:g} "
                   "with --verify)")
@click.option("--seed", type=int, default=0, show_default=True,
              help="seeds torch before build() on every rank, and the solver")
@click.option("--memory-budget", type=float, default=None, help="bytes per device")
@click.option("--time-limit", type=float, default=10.0, show_default=True, help="solver s")
@click.option("--plan", "plan_file", type=click.Path(), default=None,
              help="run this plan (from `autopar plan --out`) instead of planning")
@click.option("--set", "settings", multiple=True, help="build() argument, KEY=VALUE")
@click.option("--verify", is_flag=True,
              help="also train the single-process model in rank 0 and fail if a step's loss "
                   "or worst gradient differs by more than --tolerance relative to the tensor's "
                   "largest entry and more than --atol absolute. Meant for "
                   f"fp32 models and lr around {VERIFY_LEARNING_RATE:g}: AdamW amplifies "
                   "rounding differences in proportion to the learning rate")
@click.option("--tolerance", type=float, default=None,
              help=f"relative tolerance of --verify (default {TOLERANCE:g}; "
                   f"{BF16_TOLERANCE:g} with --precision bf16-master)")
@click.option("--atol", type=float, default=ABSOLUTE_TOLERANCE, show_default=True,
              help="absolute tolerance of --verify: a smaller difference always passes (a "
                   "gradient that is zero in exact arithmetic is rounding noise on both sides)")
@click.option("--precision", type=click.Choice(PRECISIONS), default="fp32", show_default=True,
              help="bf16-master: the model in bfloat16, trained with fp32 master weights and "
                   "AdamW states (autopar.master_weights), planned with their memory")
@click.option("--microbatches", "microbatch_text", default="auto", show_default=True,
              help="micro-batches per step (gradient accumulation), or auto")
@click.option("--pipeline", "pipeline_text", default="auto", show_default=True,
              help="pipeline over the axis named pp: auto, off, or SCHEDULE[:MICROBATCHES] "
                   "(GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble), e.g. 1F1B:4")
@click.option("--checkpoint-dir", type=click.Path(), default=None,
              help="save sharded checkpoints here (step-NNNNNNNN directories)")
@click.option("--checkpoint-every", type=int, default=0, show_default=True,
              help="steps between checkpoints (0: only after the last step)")
@click.option("--resume", is_flag=True,
              help="start after the latest complete checkpoint in --checkpoint-dir")
@click.option("--max-restarts", type=int, default=3, show_default=True,
              help="with --checkpoint-dir: times to relaunch from the latest checkpoint "
                   "after a rank dies")
@click.option("--min-nproc", type=int, default=None,
              help="with --checkpoint-dir: the fewest processes to go on with when a size "
                   "keeps failing (default: --nproc, never fewer)")
@click.option("--compression", "compression_text", default=None,
              help="let the solver compress: 'auto', or comma-separated names (bf16-reduce, "
                   "int8-gather, hpz, powersgd, powersgd-R); --verify then applies the same "
                   "rounding to the single-process model")
@click.option("--measure", is_flag=True,
              help="after training, time --steps more steps on every rank (after 2 warm-up "
                   "steps, plus one under torch.profiler) and print the plan's predictions "
                   "against them: step time (median, spread), op groups, peak memory per rank")
def run_command(model_file, nproc, mesh_text, axis_names, hardware, steps, lr, seed,
                memory_budget, time_limit, plan_file, settings, verify, tolerance, atol,
                precision, microbatch_text, pipeline_text, checkpoint_dir, checkpoint_every,
                resume, max_restarts, min_nproc, compression_text, measure) -> None:
    """Train MODEL_FILE (a .py file with build() -> (model, example_inputs)) on --nproc
    local CPU processes: the loss per step, then the bytes each collective moved against
    the plan's prediction; with --measure, the predicted step time, op groups and memory
    against measured ones."""
    from autopar.present.summary import render_measured
    from autopar.values.plan import Plan

    if measure:
        try:
            measured_steps(steps)
        except AutoparError as exc:
            raise click.ClickException(str(exc)) from exc
    shape = mesh_shape(mesh_text)
    nproc = process_count(nproc, shape, mesh_text)
    if lr is None:
        lr = VERIFY_LEARNING_RATE if verify else LEARNING_RATE
    if tolerance is None:
        tolerance = BF16_TOLERANCE if precision == "bf16-master" else TOLERANCE
    accepted = Tolerance(relative=tolerance, absolute=atol)
    try:
        run = TrainingRun(model_file, shape, parse_axis_names(axis_names, len(shape)),
                          config=tuple(config(settings).items()), hardware=hardware,
                          steps=steps, lr=lr, seed=seed, time_limit=time_limit,
                          memory_budget=memory_budget, verify=verify, precision=precision,
                          microbatches=microbatches(microbatch_text),
                          pipeline=pipeline(pipeline_text), tolerance=accepted,
                          plan=Plan.load(plan_file).to_dict() if plan_file else None,
                          checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                          resume=resume, compression=compression_names(compression_text))
        run = _planned(run)
        _announce(run, nproc, measure)
        run, trained = _recovering(run, nproc, _planned, max_restarts=max_restarts,
                                   min_nproc=nproc if min_nproc is None else min_nproc,
                                   measure=measure)
    except AutoparError as exc:
        raise click.ClickException(str(exc)) from exc
    report = trained.report
    click.echo(communication_report(report))
    if measure:
        click.echo(render_measured(Plan.from_dict(run.plan), trained.measured), nl=False)
    if verify:
        _check_verified(report, accepted, steps)


def _planned(run: TrainingRun) -> TrainingRun:
    """`run` with the plan its ranks will run (`plan_run`: made here unless given), after
    printing the plan's modelled step and memory."""
    from autopar.present.report import units  # the summary's units (autopar.present.summary)
    from autopar.tools.training import plan_run

    mesh = run.build_mesh()
    plan = plan_run(run, progress=lambda message: click.echo(f"... {message}", err=True))
    click.echo(f"{plan.model} on mesh {mesh.describe()}: modelled step "
               f"{units.ms(plan.step_time_s)}, peak memory "
               f"{units.size(plan.peak_memory_bytes)} per device"
               + (f", {plan.microbatches} micro-batches per step"
                  if plan.microbatches > 1 else "")
               + (f", pipelined in {len(plan.pipeline.stages)} stages "
                  f"({plan.pipeline.schedule})" if plan.pipeline is not None else ""))
    return dataclasses.replace(run, plan=plan.to_dict())


def _announce(run: TrainingRun, nproc: int, measure: bool = False) -> None:
    """Say what is about to train: steps, optimizer recipe, learning rate, processes, and
    whether it is verified and measured."""
    recipe = ", fp32 master weights, bf16 model" if run.precision == "bf16-master" else ""
    click.echo(f"training {run.steps} steps (AdamW{recipe}, lr {run.lr:g}) on {nproc} "
               + ("process" if nproc == 1 else "processes")
               + (", verified against the single-process model in rank 0" if run.verify
                  else "")
               + (f", then measuring {run.steps} more on every rank" if measure else ""))


def _check_verified(report: RankReport, accepted: Tolerance, steps: int) -> None:
    """Fail (`ClickException`, listing the steps) unless every step of `report` matched the
    single-process model within `accepted`; else say so, with the worst gradient."""
    failures = verification_failures(report.steps, accepted)
    if failures:
        raise click.ClickException(
            "verification failed: the compiled model differs from the single-process "
            f"model by more than {accepted.describe()}\n  " + "\n  ".join(failures)
            + "\n  (a model with dropout or other randomness never matches; the check "
            f"assumes fp32 and lr around {VERIFY_LEARNING_RATE:g})")
    worst = max(report.steps, key=lambda r: r.grad_excess)
    click.echo(f"verification passed: {steps} steps, losses and gradients within "
               f"{accepted.describe()} of the single-process model (worst gradient: "
               f"{worst.worst_param}, {worst.grad_abs_error:.1e} absolute, "
               f"{worst.grad_error:.1e} relative)")
