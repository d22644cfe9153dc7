"""The error the report raises on bad input (kept here: only the report raises it)."""

from __future__ import annotations

from autopar.errors import AutoparError


class ReportError(AutoparError, ValueError):
    """A report that cannot be written where it was asked to go."""
