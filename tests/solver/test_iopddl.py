"""Loading IOPDDL files: the example, gzip, forbidden costs and malformed files."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
from solver_cases import brute_force

from autopar.errors import ProblemFormatError
from autopar.solver import load_iopddl, solve

# The format's example problem (google/iopddl, Apache-2.0; see data/README.md).
EXAMPLE = Path(__file__).resolve().parent / "data" / "iopddl-example.json"


def document() -> dict:
    return {"problem": {"name": "t", "nodes": {"intervals": [[0, 2], [1, 3]],
                                               "costs": [[1, 10**18], [3, 4]],
                                               "usages": [[1, 2], [3, 4]]},
                        "edges": {"nodes": [[0, 1]], "costs": [[1, 2, 10**20, 4]]},
                        "usage_limit": 6}}


def write(path: Path, doc: object, zipped: bool = False) -> Path:
    text = json.dumps(doc)
    if zipped:
        with gzip.open(path, "wt") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    return path


def test_example_solves_to_its_optimum() -> None:
    problem = load_iopddl(EXAMPLE)
    assert problem.num_nodes == 5 and problem.num_edges == 5 and problem.usage_limit == 50
    solution = solve(problem, time_limit=5.0)
    assert solution.status == "optimal"
    assert solution.cost == brute_force(problem) == problem.cost(solution.choices)
    assert problem.is_feasible(solution.choices)


@pytest.mark.parametrize("zipped", [False, True])
def test_forbidden_costs_become_inf(tmp_path: Path, zipped: bool) -> None:
    name = "p.json.gz" if zipped else "p.json"
    problem = load_iopddl(write(tmp_path / name, document(), zipped))
    assert problem.node_costs[0][1] == math.inf
    assert problem.edge_costs[0][1, 0] == math.inf
    assert problem.edge_costs[0].shape == (2, 2)
    assert problem.cost([0, 1]) == 1 + 4 + 2 and problem.usage_limit == 6


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ProblemFormatError, match="no problem file"):
        load_iopddl(tmp_path / "absent.json")


def test_truncated_gzip(tmp_path: Path) -> None:
    path = write(tmp_path / "p.json.gz", document(), zipped=True)
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(ProblemFormatError):
        load_iopddl(path)


@pytest.mark.parametrize("edit", [
    lambda d: d.pop("problem"),
    lambda d: d["problem"].pop("nodes"),
    lambda d: d["problem"]["nodes"].pop("usages"),
    lambda d: d["problem"]["edges"].__setitem__("costs", [[1, 2, 3]]),
    lambda d: d["problem"]["edges"].__setitem__("nodes", [[0, 5]]),
    lambda d: d["problem"]["nodes"].__setitem__("costs", "abc"),
    lambda d: d["problem"]["nodes"]["costs"].__setitem__(0, ["x", 1]),
    lambda d: d["problem"].__setitem__("usage_limit", "big"),
    lambda d: d["problem"]["nodes"]["intervals"].__setitem__(0, [0]),
])
def test_malformed_documents(tmp_path: Path, edit) -> None:
    doc = document()
    edit(doc)
    with pytest.raises(ProblemFormatError):
        load_iopddl(write(tmp_path / "bad.json", doc))


def test_not_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{nodes: [")
    with pytest.raises(ProblemFormatError, match="JSON"):
        load_iopddl(path)
