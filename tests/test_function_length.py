"""Every function of `autopar` and `passes` fits a screen: at most 60 lines from its `def` to its
last line (decorators not counted), unless its docstring states why in a line that starts with
"Length:"."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "autopar", ROOT / "passes")
MAX_LINES = 60


def _states_reason(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    docstring = ast.get_docstring(function) or ""
    return any(line.strip().startswith("Length:") for line in docstring.splitlines())


def _too_long() -> list[str]:
    """`path:line name (n lines)` for each function over MAX_LINES without a stated reason."""
    found = []
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                # `lineno` is the `def` line: decorators sit above it and are not counted.
                length = node.end_lineno - node.lineno + 1
                if length > MAX_LINES and not _states_reason(node):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                                 f"({length} lines)")
    return found


def test_functions_fit_a_screen():
    too_long = _too_long()
    assert not too_long, (
        f"functions longer than {MAX_LINES} lines, with no 'Length:' line in their docstring:\n"
        + "\n".join(too_long))
