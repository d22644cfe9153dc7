"""The `autopar` command line: `autopar plan FILE.py`, `autopar solve PROBLEM.json`."""

from __future__ import annotations

import sys

import click

from autopar.errors import AutoparError


def _mesh_shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.lower().split("x"))
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: expected sizes joined by 'x', e.g. 2x4") from exc


def _config(pairs: tuple[str, ...]) -> dict:
    config = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r}: expected KEY=VALUE")
        try:
            config[key] = int(value)
        except ValueError:
            config[key] = value
    return config


def _default_axis_names(ndim: int) -> tuple[str, ...]:
    return ("dp", "tp", "cp")[:ndim] if ndim <= 3 else tuple(f"a{i}" for i in range(ndim))


@click.group()
def main() -> None:
    """autopar: automatic parallelization of PyTorch models."""


@main.command("plan")
@click.argument("model_file", type=click.Path())
@click.option("--mesh", "mesh_text", default="8", show_default=True, help="mesh shape, e.g. 2x4")
@click.option("--axis-names", default=None, help="comma-separated axis names (default dp,tp,..)")
@click.option("--hardware", default="h100-sxm", show_default=True, help="profile name or path")
@click.option("--memory-budget", type=float, default=None, help="bytes per device")
@click.option("--time-limit", type=float, default=30.0, show_default=True, help="solver s")
@click.option("--set", "settings", multiple=True, help="build() argument, KEY=VALUE")
@click.option("--out", type=click.Path(), default=None, help="write the plan as JSON")
def plan_command(model_file, mesh_text, axis_names, hardware, memory_budget, time_limit,
                 settings, out) -> None:
    """Plan MODEL_FILE (a .py file with build() -> (model, example_inputs))."""
    from autopar.api import plan
    from autopar.mesh import Mesh
    from autopar.model_file import load_model_file

    shape = _mesh_shape(mesh_text)
    names = tuple(axis_names.split(",")) if axis_names else _default_axis_names(len(shape))
    try:
        mesh = Mesh(shape, names, hardware)
        model, inputs = load_model_file(model_file, **_config(settings))
        result = plan(model, mesh, inputs, memory_budget=memory_budget, time_limit=time_limit,
                      progress=lambda message: click.echo(f"... {message}", err=True))
    except AutoparError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(result.summary())
    if out:
        result.save(out)
        click.echo(f"plan written to {out}")


@main.command("solve")
@click.argument("problem_file", type=click.Path())
@click.option("--timeout", type=float, default=60.0, show_default=True, help="seconds")
def solve_command(problem_file, timeout) -> None:
    """Solve a sharding problem in the IOPDDL contest format."""
    from autopar.solver.command import solve_command as run

    try:
        sys.exit(run(problem_file, timeout))
    except AutoparError as exc:
        raise click.ClickException(str(exc)) from exc
