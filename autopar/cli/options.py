"""Option parsing shared by the commands: mesh shapes, axis names, `--set KEY=VALUE`,
micro-batches, pipelines, the steps `--measure` times."""

from __future__ import annotations

import click


def mesh_shape(text: str) -> tuple[int, ...]:
    """`"2x4"` -> `(2, 4)`."""
    try:
        return tuple(int(part) for part in text.lower().split("x"))
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: expected sizes joined by 'x', e.g. 2x4") from exc


def config(pairs: tuple[str, ...]) -> dict:
    """`("batch=8", "act=gelu")` -> `{"batch": 8, "act": "gelu"}` (ints where they parse)."""
    parsed = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r}: expected KEY=VALUE")
        try:
            parsed[key] = int(value)
        except ValueError:
            parsed[key] = value
    return parsed


def axis_names(text: str | None, ndim: int) -> tuple[str, ...]:
    """Comma-separated names, or dp, tp, cp (a0, a1, ... beyond three axes)."""
    if text:
        return tuple(text.split(","))
    return ("dp", "tp", "cp")[:ndim] if ndim <= 3 else tuple(f"a{i}" for i in range(ndim))


def microbatches(text: str) -> int | str:
    """`"auto"` or a positive count of micro-batches."""
    if text == "auto":
        return text
    try:
        count = int(text)
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: expected 'auto' or a count, e.g. 4") from exc
    if count < 1:
        raise click.BadParameter(f"{text!r}: expected a count of at least 1")
    return count


def pipeline(text: str):
    """`"auto"`, `"off"` (False), or `SCHEDULE[:MICROBATCHES]` as an `autopar.Pipeline` over
    the axis named pp (e.g. `1F1B:8`, `Interleaved1F1B`)."""
    from autopar.errors import PipelineError
    from autopar.values.pipeline import Pipeline

    if text in ("auto", "off"):
        return text == "auto" and "auto"
    name, _, count = text.partition(":")
    try:
        return Pipeline(schedule=name, microbatches=int(count) if count else None)
    except (PipelineError, ValueError) as exc:
        raise click.BadParameter(f"{text!r}: expected auto, off or SCHEDULE[:MICROBATCHES], "
                                 f"e.g. 1F1B:8 ({exc})") from exc


def measured_steps(steps: int) -> int:
    """The steps `autopar run --measure` times: `--steps`, at least one. Raises
    `TrainingRunError` (an `AutoparError`) otherwise, before anything is planned or any
    rank starts."""
    from autopar.errors import TrainingRunError

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise TrainingRunError(
            "--measure has no step to time", expected="--steps N with N >= 1: the run trains "
            "N steps, then times N more on every rank", got=f"--steps {steps}",
            fix="e.g. --measure --steps 5")
    return steps


def model_options(*, mesh: str, hardware: str, time_limit: float):
    """The options of a command that plans a model file: `--mesh` (default `mesh`),
    `--axis-names`, `--hardware`, `--memory-budget`, `--time-limit` and `--set`."""
    options = (
        click.option("--mesh", "mesh_text", default=mesh, show_default=True,
                     help="mesh shape, e.g. 2x4"),
        click.option("--axis-names", default=None,
                     help="comma-separated axis names (default dp,tp,..)"),
        click.option("--hardware", default=hardware, show_default=True,
                     help="profile name or path; comma-separated for a mesh of several kinds "
                          "(one per index of the outermost axis, or one per device)"),
        click.option("--memory-budget", type=float, default=None, help="bytes per device"),
        click.option("--time-limit", type=float, default=time_limit, show_default=True,
                     help="solver s"),
        click.option("--set", "settings", multiple=True, help="build() argument, KEY=VALUE"),
    )

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def hardware_kinds(text: str) -> str | list[str]:
    """`--hardware`: one profile, or the comma-separated kinds of a mixed mesh."""
    return text.split(",") if "," in text else text


def compression_names(text: str | None) -> str | tuple[str, ...] | None:
    """`--compression`: None, "auto", or the comma-separated names, as `plan` takes them."""
    if text is None or text == "auto":
        return text
    return tuple(name.strip() for name in text.split(","))


def mesh_shares(text: str | None, ndim: int) -> tuple | str | None:
    """`--shares`: "even", or per axis (comma-separated) the colon-separated weights of its
    indices, "-" for DTensor's chunks ("-,3:1" on a 2-D mesh); None where not given."""
    if text is None or text == "even":
        return text
    parts = text.split(",")
    try:
        shares = tuple(None if part == "-" else tuple(int(w) for w in part.split(":"))
                       for part in parts)
    except ValueError:
        shares = ()
    if len(shares) != ndim:
        raise click.BadParameter(
            f"{text!r}: expected 'even', or one entry per mesh axis ({ndim}), comma-separated, "
            "each '-' or the colon-separated weights of its indices, e.g. 3:3:1:1",
            param_hint="--shares")
    return shares


def process_count(nproc: int | None, shape: tuple[int, ...], mesh_text: str) -> int:
    """The processes to run: `nproc`, by default one per device of the mesh `shape`
    (`mesh_text` as given); `BadParameter` for any other count."""
    size = 1
    for axis in shape:
        size *= axis
    if nproc is None:
        nproc = size
    if nproc != size:
        raise click.BadParameter(
            f"{nproc} processes for mesh {mesh_text} of {size} devices; expected one process "
            f"per device: --nproc {size}, or a mesh of {nproc} devices", param_hint="--nproc")
    return nproc
