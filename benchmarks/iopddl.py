"""Solve the public IOPDDL instances within their contest timeouts and print a table.

    python benchmarks/iopddl.py [--instances A,G] [--scale-timeout 1.0] [--dir PATH]

Per instance: size, size after the exact reductions, cost, whether memory fits (peak vs
limit), points = best known cost / our cost (the contest's score; 1.0 = best any team
reached), and the wall time including loading. Loading and reductions count against the
timeout, as in the contest.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from autopar.solver import load_iopddl, solve

DEFAULT_DIR = Path(__file__).resolve().parents[1].parent / "shared/benchmarks/iopddl"
# Timeout in seconds and best known cost, from the benchmark's README.
INSTANCES = {"A": (60, 6_548_641_531), "G": (120, 217_039),
             "M": (180, 49_928_460_991), "S": (240, 1_534_613_444)}


@dataclass(frozen=True)
class Row:
    name: str
    nodes: int
    edges: int
    reduced: str
    cost: float
    peak: float
    limit: float | None
    feasible: bool
    points: float
    seconds: float
    timeout: float
    status: str


def run(name: str, folder: Path, scale: float) -> Row:
    timeout, best_known = INSTANCES[name]
    timeout *= scale
    start = time.monotonic()
    problem = load_iopddl(folder / f"asplos-2025-iopddl-{name}.json.gz")
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        print(f"  [{name} {time.monotonic() - start:6.1f}s] {line}", flush=True)

    budget = timeout - (time.monotonic() - start) - max(0.5, 0.02 * timeout)
    solution = solve(problem, time_limit=budget, progress=progress)
    seconds = time.monotonic() - start
    found = next((m for m in map(re.compile(r"to (\d+) nodes, (\d+) edges").search, lines)
                  if m), None)
    reduced = f"{found.group(1)}/{found.group(2)}" if found else "?"
    feasible = bool(solution.choices) and problem.is_feasible(solution.choices)
    peak = problem.peak_usage(solution.choices) if solution.choices else float("nan")
    points = best_known / solution.cost if feasible else 0.0
    return Row(name, problem.num_nodes, problem.num_edges, reduced, solution.cost, peak,
               problem.usage_limit, feasible, points, seconds, timeout, solution.status)


def table(rows: list[Row]) -> str:
    head = (f"{'inst':<5}{'nodes':>7}{'edges':>7}{'reduced n/e':>13}{'cost':>17}"
            f"{'peak/limit':>12}{'fits':>6}{'points':>8}{'time':>8}{'limit':>7}  status")
    out = [head, "-" * len(head)]
    for r in rows:
        ratio = r.peak / r.limit if r.limit else float("nan")
        out.append(f"{r.name:<5}{r.nodes:>7}{r.edges:>7}{r.reduced:>13}{r.cost:>17.0f}"
                   f"{ratio:>12.4f}{'yes' if r.feasible else 'NO':>6}{r.points:>8.4f}"
                   f"{r.seconds:>7.1f}s{r.timeout:>6.0f}s  {r.status}")
    if rows:
        average = sum(r.points for r in rows) / len(rows)
        out.append(f"average points over {len(rows)} instances: {average:.4f}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", default="A,G,M,S")
    parser.add_argument("--scale-timeout", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    names = [n.strip().upper() for n in args.instances.split(",") if n.strip()]
    unknown = [n for n in names if n not in INSTANCES]
    if unknown:
        parser.error(f"unknown instances {unknown}; choose from {sorted(INSTANCES)}")
    rows = []
    for name in names:
        rows.append(run(name, args.dir, args.scale_timeout))
        print(table(rows[-1:]).splitlines()[-2], flush=True)
    print()
    print(table(rows))
    return 0 if all(r.feasible for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
