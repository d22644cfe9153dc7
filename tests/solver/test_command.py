"""`solve_command`: contest-style output of `autopar solve`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autopar.errors import ProblemFormatError
from autopar.solver.command import process_age, solve_command


def write(path: Path, limit: float) -> Path:
    doc = {"problem": {"name": "tiny", "nodes": {"intervals": [[0, 2], [1, 3]],
                                                  "costs": [[5, 1], [2, 3]],
                                                  "usages": [[1, 4], [1, 1]]},
                       "edges": {"nodes": [[0, 1]], "costs": [[0, 7, 7, 0]]},
                       "usage_limit": limit}}
    path.write_text(json.dumps(doc))
    return path


def test_last_lines_are_cost_and_choices(tmp_path: Path) -> None:
    lines: list[str] = []
    code = solve_command(str(write(tmp_path / "p.json", 10)), 5.0, echo=lines.append)
    assert code == 0
    assert lines[-1] == "[1, 1]" and lines[-2] == "4"
    assert all(line.startswith("#") for line in lines[:-2])


def test_memory_limit_changes_the_answer(tmp_path: Path) -> None:
    lines: list[str] = []
    assert solve_command(str(write(tmp_path / "p.json", 3)), 5.0, echo=lines.append) == 0
    assert lines[-1] == "[0, 0]" and lines[-2] == "7"


def test_nothing_fits(tmp_path: Path) -> None:
    lines: list[str] = []
    assert solve_command(str(write(tmp_path / "p.json", 1)), 5.0, echo=lines.append) == 1
    assert lines[-1] == "[]" and float(lines[-2]) == math.inf


def test_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(ProblemFormatError):
        solve_command(str(tmp_path / "none.json"), 5.0, echo=lambda _: None)


def test_progress_lines_only_when_asked(tmp_path: Path) -> None:
    quiet: list[str] = []
    solve_command(str(write(tmp_path / "p.json", 10)), 5.0, echo=quiet.append)
    assert [line for line in quiet if line.startswith("#")] == quiet[:1]
    assert quiet[0].startswith("# status optimal") and "since the process began" in quiet[0]
    shown: list[str] = []
    solve_command(str(write(tmp_path / "p.json", 10)), 5.0, echo=shown.append,
                  progress=True)
    assert any("objective" in line and "bound" in line and "gap" in line for line in shown)
    assert shown[-2:] == quiet[-2:]


def test_process_age_counts_the_interpreter_start() -> None:
    age = process_age()
    assert 0.0 < age < 3600.0
