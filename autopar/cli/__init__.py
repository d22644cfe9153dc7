"""The `autopar` command line: one module per command, registered on the `main` group.

- `autopar plan FILE.py ...` (`plan.py`): plan a model and print what it costs.
- `autopar solve PROBLEM.json` (`solve.py`): solve a sharding problem (IOPDDL format).
- `autopar run FILE.py ...` (`run.py`): train a model on local processes, optionally verified.
"""

from __future__ import annotations

import click

from autopar.cli.check import check_command
from autopar.cli.plan import plan_command
from autopar.cli.report import report_command
from autopar.cli.run import run_command
from autopar.cli.solve import solve_command


@click.group()
def main() -> None:
    """autopar: automatic parallelization of PyTorch models."""


for command in (plan_command, solve_command, run_command, report_command, check_command):
    main.add_command(command)
