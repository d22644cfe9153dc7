"""`autopar report PLAN.json -o PLAN.html`: draw a saved plan as a self-contained HTML page
(or as graphviz DOT text with `--dot`)."""

from __future__ import annotations

from pathlib import Path

import click

from autopar.errors import AutoparError


@click.command("report")
@click.argument("plan_file", type=click.Path())
@click.option("-o", "--out", type=click.Path(), default=None,
              help="HTML file to write (default: PLAN_FILE with .html)")
@click.option("--dot", "dot_out", type=click.Path(), default=None,
              help="also write the graph as graphviz DOT text to this file")
def report_command(plan_file, out, dot_out) -> None:
    """Write the report of PLAN_FILE (a plan saved by `autopar plan --out` or plan.save)."""
    from autopar.present.report import ReportError, to_dot, write_report
    from autopar.values.plan import Plan

    target = Path(out) if out else Path(plan_file).with_suffix(".html")
    try:
        plan = Plan.load(plan_file)
        written = write_report(plan, target)
    except AutoparError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"report written to {written}")
    if dot_out:
        try:
            Path(dot_out).write_text(to_dot(plan))
        except OSError as exc:
            error = ReportError(f"cannot write the graph to {dot_out}: {exc.strerror or exc}",
                                expected="a writable file path, e.g. plan.dot", got=dot_out,
                                fix="choose a path in an existing, writable directory")
            raise click.ClickException(str(error)) from exc
        click.echo(f"graph written to {dot_out}")
