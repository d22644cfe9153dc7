"""`autopar check FILE.py`: list the ops of a model file's `build()`, the rule family that
shards each and how its FLOPs are counted, then the shares of nodes and FLOPs with a rule.

Nothing is planned: this is the quick look before `autopar plan`, to see which ops would run
whole on every device. A model torch.export cannot capture is reported like any bad input
(what, expected, got, fix) with a non-zero exit.
"""

from __future__ import annotations

import click

from autopar.cli.options import config
from autopar.errors import AutoparError


@click.command("check")
@click.argument("model_file", type=click.Path())
@click.option("--set", "settings", multiple=True, help="build() argument, KEY=VALUE")
def check_command(model_file, settings) -> None:
    """Check MODEL_FILE (a .py file with build() -> (model, example_inputs))."""
    from autopar.tools.coverage import check
    from autopar.tools.model_file import load_model_file

    try:
        model, inputs = load_model_file(model_file, **config(settings))
        report = check(model, inputs)
    except AutoparError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(report.table())
