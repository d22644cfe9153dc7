"""Read and write sharding problems in the IOPDDL contest format (`.json` or `.json.gz`).

The format: `{"problem": {"name", "nodes": {"intervals", "costs", "usages"},
"edges": {"nodes", "costs"}, "usage_limit"}}`, edge costs flattened row-major. A cost of
10**18 or more marks a forbidden choice and becomes `math.inf`; all other values are exact
integers below 2**53 in the contest files, so float64 holds them and their sums exactly.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np

from autopar.errors import ProblemFormatError
from autopar.solver.problem import ShardingProblem

FORBIDDEN = 10**18


def _costs(values: object, what: str) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProblemFormatError(f"{what} are not numbers", expected="a list of integers",
                                 got=repr(values)[:80], fix="repair the file") from exc
    if array.ndim != 1:
        raise ProblemFormatError(f"{what} are not a flat list", expected="a list of numbers",
                                 got=f"shape {array.shape}", fix="repair the file")
    array[array >= FORBIDDEN] = math.inf
    return array


def _field(mapping: object, key: str, where: str) -> object:
    if not isinstance(mapping, dict) or key not in mapping:
        found = sorted(mapping) if isinstance(mapping, dict) else type(mapping).__name__
        raise ProblemFormatError(f"missing field {where}.{key}",
                                 expected=f"an IOPDDL problem with {where}.{key}",
                                 got=f"{found}"[:120],
                                 fix="see tests/solver/data/README.md for the format")
    return mapping[key]


def _read_json(path: Path) -> object:
    if not path.is_file():
        raise ProblemFormatError(f"no problem file at {path}", expected="an existing file",
                                 got=str(path), fix="check the path")
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as handle:
                return json.load(handle)
        with path.open(encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProblemFormatError(f"cannot read {path} as JSON", expected="IOPDDL JSON(.gz)",
                                 got=f"{type(exc).__name__}: {exc}"[:160],
                                 fix="check that the file is complete and not corrupted") from exc


def load_iopddl(path: str | Path) -> ShardingProblem:
    """Load an IOPDDL problem file; raise `ProblemFormatError` if missing or malformed."""
    path = Path(path)
    document = _read_json(path)
    problem = _field(document, "problem", "document")
    nodes = _field(problem, "nodes", "problem")
    edges = _field(problem, "edges", "problem")
    intervals = _field(nodes, "intervals", "nodes")
    costs = _field(nodes, "costs", "nodes")
    usages = _field(nodes, "usages", "nodes")
    pairs = _field(edges, "nodes", "edges")
    edge_costs = _field(edges, "costs", "edges")
    for name, value in (("nodes.intervals", intervals), ("nodes.costs", costs),
                        ("nodes.usages", usages), ("edges.nodes", pairs),
                        ("edges.costs", edge_costs)):
        if not isinstance(value, list):
            raise ProblemFormatError(f"{name} is not a list", expected="a JSON list",
                                     got=type(value).__name__, fix="repair the file")
    node_costs = tuple(_costs(c, f"costs of node {i}") for i, c in enumerate(costs))
    node_usages = tuple(_costs(u, f"usages of node {i}") for i, u in enumerate(usages))
    matrices = tuple(_costs(c, f"costs of edge {e}") for e, c in enumerate(edge_costs))
    limit = problem.get("usage_limit") if isinstance(problem, dict) else None
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))):
        raise ProblemFormatError("usage_limit is not a number", expected="a number or null",
                                 got=repr(limit)[:80], fix="repair the file")
    name = problem.get("name", "") if isinstance(problem, dict) else ""
    return ShardingProblem(node_costs=node_costs, node_usages=node_usages,
                           intervals=tuple(tuple(iv) if isinstance(iv, list) else iv
                                           for iv in intervals),
                           edges=tuple(tuple(p) if isinstance(p, list) else p for p in pairs),
                           edge_costs=matrices, usage_limit=limit,
                           name=str(name) or path.name.split(".")[0])


def _numbers(values: np.ndarray) -> list:
    """JSON numbers of the contest's files: inf as FORBIDDEN, integral values as ints."""
    finite = np.isfinite(values)
    if np.array_equal(values[finite], np.round(values[finite])):
        return np.where(finite, values, FORBIDDEN).astype(np.int64).tolist()
    return [FORBIDDEN if math.isinf(v) else v for v in values.tolist()]


def write_iopddl(problem: ShardingProblem, path: str | Path) -> Path:
    """Write `problem` in the contest's JSON format (gzip-compressed when `path` ends in
    .gz), so that `load_iopddl(path)` gives it back; the format holds neither ties nor edge
    usages, so a problem with either raises `ProblemFormatError`."""
    if problem.ties or problem.edge_usages:
        raise ProblemFormatError("the IOPDDL format holds neither ties nor edge usages",
                                 expected="a problem without them", got="ties or edge usages",
                                 fix="write a problem of the contest's kind")
    document = {"problem": {
        "name": problem.name,
        "nodes": {"intervals": [list(iv) for iv in problem.intervals],
                  "costs": [_numbers(c) for c in problem.node_costs],
                  "usages": [_numbers(u) for u in problem.node_usages]},
        "edges": {"nodes": [list(e) for e in problem.edges],
                  "costs": [_numbers(m.ravel()) for m in problem.edge_costs]},
        "usage_limit": _numbers(np.array([problem.usage_limit]))[0]
        if problem.usage_limit is not None else None}}
    path = Path(path)
    text = json.dumps(document, separators=(",", ":"))
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=6) as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path
