"""The pipeline a planning call asks for (`pipeline_request`), and whether it can run:
stages, blocks, micro-batches (`check_request`)."""

from __future__ import annotations

from collections.abc import Sequence

from autopar.errors import PipelineError
from autopar.values.mesh import Mesh
from autopar.values.pipeline import Pipeline, Schedule


def pipeline_request(mesh: Mesh, pipeline: Pipeline | str | bool | None) -> Pipeline | None:
    """The pipeline `plan(pipeline=...)` asks for on `mesh`: the one given, one over the
    axis named "pp" for "auto" when the mesh has it (of 2 or more), else None."""
    if isinstance(pipeline, Pipeline):
        return pipeline
    if pipeline is False or pipeline is None:
        return None
    if pipeline == "auto":
        names = mesh.axis_names
        return Pipeline() if "pp" in names and mesh.shape[names.index("pp")] > 1 else None
    raise PipelineError("pipeline must be 'auto', False or an autopar.Pipeline",
                        expected="'auto', False or Pipeline(axis='pp', ...)",
                        got=repr(pipeline), fix="pipeline=autopar.Pipeline(schedule='1F1B')")


def check_request(pipeline: Pipeline, ranks: int, blocks: int, batch: int | None) -> None:
    """Refuse, before any solve, a `pipeline` that can't run on `ranks` pipeline ranks for a
    model of `blocks` blocks and a batch of `batch` samples (`PipelineError` with the fix)."""
    if ranks < 2:
        raise PipelineError(f"pipeline axis {pipeline.axis!r} has {ranks} device",
                            expected="a pipeline axis of at least 2 devices",
                            got=f"{ranks}", fix="give the mesh a 'pp' axis of 2 or more")
    runnable = [s for s in pipeline.schedules() if pipeline.stage_counts(s, ranks)]
    if not runnable:
        raise PipelineError(f"{pipeline.stages} stages can't run on {ranks} pipeline ranks",
                            expected=f"{ranks} stages (one per rank) or a multiple of {ranks} "
                                     "of at least twice that (interleaved)",
                            got=f"stages={pipeline.stages}, schedule={pipeline.schedule}",
                            fix=f"Pipeline(stages={ranks}) or leave stages=None")
    least = min(min(pipeline.stage_counts(s, ranks)) for s in runnable)
    if pipeline.cuts and pipeline.cuts[-1] >= blocks:
        raise PipelineError(f"a cut at block {pipeline.cuts[-1]} of a model of {blocks} blocks",
                            expected=f"cuts below {blocks}", got=repr(pipeline.cuts),
                            fix="cut at blocks the model has, or leave cuts out")
    if least > blocks:
        raise PipelineError(f"{least} stages need at least {least} blocks to cut between",
                            expected=f"at most {blocks} stages (the model's blocks: layers "
                                     "of a ModuleList)", got=f"{least} stages",
                            fix="use fewer pipeline ranks or stages, or a deeper model")
    if pipeline.microbatches is not None:
        if batch is not None and batch % pipeline.microbatches:
            raise PipelineError(f"{pipeline.microbatches} micro-batches don't divide the "
                                f"batch of {batch}", expected="a divisor of the batch",
                                got=str(pipeline.microbatches),
                                fix=f"microbatches in {divisors(batch)}")
        reasons = [s.check_microbatches(pipeline.microbatches, ranks) for s in runnable]
        if all(reasons):
            raise PipelineError(f"{pipeline.microbatches} micro-batches can't run the "
                                "pipeline", expected=reasons[0], got=str(pipeline.microbatches),
                                fix=f"microbatches={_least_fitting(runnable, ranks, batch)}")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _least_fitting(schedules: Sequence[Schedule], ranks: int, batch: int | None) -> int:
    for m in divisors(batch) if batch else range(1, 4 * ranks + 1):
        if any(s.check_microbatches(m, ranks) is None for s in schedules):
            return m
    return ranks
