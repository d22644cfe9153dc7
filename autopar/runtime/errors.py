"""Errors of the distributed runtime.

Like every autopar error they say what was expected, what was given and how to fix it, and
they are also the builtin kind a caller would catch (`RuntimeError`, `ValueError`,
`NotImplementedError`).
"""

from __future__ import annotations

from autopar.errors import AutoparError


class LaunchError(AutoparError, RuntimeError):
    """A rank started by `launch` raised, died, or did not finish in time.

    `rank` is the first rank seen failing (None when all of them merely timed out) and
    `failures` maps every failed rank to the text of its traceback or exit status.
    """

    def __init__(self, what: str, *, rank: int | None = None,
                 failures: dict[int, str] | None = None, **kwargs: str) -> None:
        self.rank = rank
        self.failures = dict(failures or {})
        super().__init__(what, **kwargs)


class ProcessGroupError(AutoparError, RuntimeError):
    """No default process group, or one whose size does not match the mesh."""


class RedistributionError(AutoparError, ValueError):
    """A redistribution asked of a tensor that does not fit it (shape, grad, hooks)."""


class UnsupportedRedistributionError(AutoparError, NotImplementedError):
    """A placement change that is not one collective over one axis.

    Converting the placement of an outer mesh axis on a tensor dim that an inner axis also
    shards reorders the chunks across both axes; it needs a multi-axis exchange that the
    runtime does not perform. The planner must avoid such edges or split them into steps.
    """


class LaunchArgumentError(AutoparError, ValueError):
    """`launch` was given a process count, function or arguments it cannot use."""
