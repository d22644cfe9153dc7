"""`autopar solve PROBLEM.json`: solve a sharding problem in the IOPDDL contest format."""

from __future__ import annotations

import os
import sys

import click

from autopar.errors import AutoparError


@click.command("solve")
@click.argument("problem_file", type=click.Path())
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="seconds, counted from the process's start")
@click.option("--progress", is_flag=True,
              help="print the objective, bound and gap over time (lines starting with #)")
def solve_command(problem_file, timeout, progress) -> None:
    """Solve a sharding problem in the IOPDDL contest format."""
    from autopar.solver.command import solve_command as run

    try:
        code = run(problem_file, timeout, progress=progress)
    except AutoparError as exc:
        raise click.ClickException(str(exc)) from exc
    # The answer is out: leave now. Tearing down the interpreter (freeing a large problem
    # and the solver's models) takes seconds that would count against the timeout.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
