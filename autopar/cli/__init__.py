"""The `autopar` command line: one module per command, imported when the command is used.

- `autopar plan FILE.py ...` (`plan.py`): plan a model and print what it costs.
- `autopar solve PROBLEM.json` (`solve.py`): solve a sharding problem (IOPDDL format).
- `autopar run FILE.py ...` (`run.py`): train a model on local processes, optionally verified.
- `autopar profile --nproc N --mesh 2x2 --out FILE.json` (`profile.py`): measure a mesh.
- `autopar generate FILE.py ...` (`generate.py`): decode with a causal LM on local processes.
"""

from __future__ import annotations

from importlib import import_module

import click

# Command name -> (module, attribute). A command's module is imported only when that
# command runs or help lists it, so `autopar solve` starts without importing torch.
COMMANDS = {
    "plan": ("autopar.cli.plan", "plan_command"),
    "solve": ("autopar.cli.solve", "solve_command"),
    "run": ("autopar.cli.run", "run_command"),
    "report": ("autopar.cli.report", "report_command"),
    "check": ("autopar.cli.check", "check_command"),
    "profile": ("autopar.cli.profile", "profile_command"),
    "generate": ("autopar.cli.generate", "generate_command"),
}


class _Commands(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attribute = COMMANDS[name]
        return getattr(import_module(module), attribute)


@click.group(cls=_Commands)
def main() -> None:
    """autopar: automatic parallelization of PyTorch models."""
