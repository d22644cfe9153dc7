"""Solve a generated family of sharding problems as the contest did and print a table.

    python benchmarks/solver_family.py [--count 20] [--seed 0] [--instances 0-03-462,A]
                                       [--scale-timeout 1.0] [--public] [--dir PATH]
    python benchmarks/solver_family.py --long [--factor 4]  # record the best costs found
    python benchmarks/solver_family.py --quick   # two small instances, 4 s each

The instances: `autopar.tools.instances.family_members(count, seed)` (sizes from 200 to
40,000 nodes, each with its own traits, like the IOPDDL contest's; that module says how
they compare), each written to a temporary folder in the contest's format; with
`--public`, also the contest's instances A, G, M, S from `--dir` (benchmarks/iopddl.py's
folder, by default). `--quick` solves two small members with a 4 s limit each (with
`--long`, for `--factor` times their own limits).

Each run is a fresh `autopar solve FILE --timeout T --progress` process
(benchmarks/iopddl.py's `solve_once`: start-up and loading count, as in the contest),
with the member's timeout (`instances.timeout_for`: 15 s at 200 nodes to 250 s at
40,000) times `--scale-timeout`. Per instance: nodes, strategies, usage limit, the cost
(checked here: an answer that does not fit scores 0), the best known cost, points = best
known / our cost (the contest's score), the solver's status and the process's wall time
against the limit; then the average points.

Best known costs: a public instance's is the contest's; a generated one's is the least
recorded in benchmarks/data/solver_family_best.json for the same file (its SHA-256: a
record of an instance the generator no longer makes is not used) or found by this run
(marked *). `--long` runs every instance for `--factor` times its limit and merges what
it finds into that file, keeping the least cost of all runs. A full `--long` of the 20
members at factor 4 runs 4 x 1,460 s of solves: about 1 h 40 min with the writing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autopar.solver import ShardingProblem, load_iopddl  # noqa: E402
from autopar.solver.iopddl import write_iopddl  # noqa: E402
from autopar.tools.instances import Instance, family_members  # noqa: E402
from benchmarks.iopddl import DEFAULT_DIR, INSTANCES, instance_path, solve_once  # noqa: E402

RECORD = ROOT / "benchmarks" / "data" / "solver_family_best.json"
# `--quick`: two small members of family(20, 0) that keep the solver busy for seconds (on
# 2 idle cores it proves the first optimal in about 2 s, the second in about 9 s).
QUICK_INSTANCES, QUICK_TIMEOUT = ("0-03-462", "0-06-1066"), 4.0


@dataclass(frozen=True)
class Result:
    """One run: the instance's size, the checked cost and the best known one."""

    name: str
    nodes: int
    strategies: int
    limit: float
    cost: float
    fits: bool
    best: float
    new_best: bool
    status: str
    seconds: float
    timeout: float

    @property
    def points(self) -> float:
        """best known / cost, 0 when the answer does not fit (the contest's score)."""
        return self.best / self.cost if self.fits and self.cost > 0 else float(self.fits)


def fingerprint(path: Path) -> str:
    """SHA-256 of a written instance file: the identity its record is kept under."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_record(path: Path) -> dict[str, dict]:
    """The recorded best costs: {name: {"sha256", "cost", "nodes", "timeout"}}."""
    return json.loads(path.read_text()) if path.is_file() else {}


def recorded_best(record: dict[str, dict], name: str, digest: str) -> float:
    """The least cost recorded for the instance of this name and file, else inf."""
    entry = record.get(name)
    return float(entry["cost"]) if entry and entry["sha256"] == digest else float("inf")


def merged(record: dict[str, dict], result: Result, digest: str) -> dict[str, dict]:
    """`record` with `result`'s cost where it fits and beats the recorded one (or the
    record is of another file); the record's other entries unchanged."""
    if not result.fits or result.cost >= recorded_best(record, result.name, digest):
        return record
    cost = int(result.cost) if result.cost.is_integer() else result.cost
    entry = {"sha256": digest, "cost": cost, "nodes": result.nodes, "timeout": result.timeout}
    return {**record, result.name: entry}


def run_one(name: str, problem: ShardingProblem, path: Path, timeout: float, best: float,
            logs: Path) -> Result:
    """Solve `path` in a fresh process; the checked cost, scored against `best` (or the
    run's own cost when better)."""
    choices, _, status, _, seconds = solve_once(name, path, timeout, logs / f"{name}.log")
    fits = bool(choices) and problem.is_feasible(tuple(choices))
    cost = problem.cost(tuple(choices)) if fits else float("inf")
    return Result(name, problem.num_nodes, sum(c.size for c in problem.node_costs),
                  float(problem.usage_limit or 0.0), cost, fits, min(best, cost),
                  fits and cost < best, status, seconds, timeout)


def table(results: list[Result]) -> str:
    """A header and a row per result (`*`: this run found the best known cost)."""
    head = (f"{'instance':<11}{'nodes':>7}{'strategies':>11}{'limit':>11}{'cost':>17}"
            f"{'best':>18}{'points':>8}{'status':>10}{'time':>9}{'limit':>7}")
    out = [head, "-" * len(head)]
    for r in results:
        out.append(f"{r.name:<11}{r.nodes:>7}{r.strategies:>11}{r.limit:>11.4g}"
                   f"{r.cost:>17.0f}{r.best:>17.0f}{'*' if r.new_best else ' '}"
                   f"{r.points:>8.4f}{r.status:>10}{r.seconds:>8.1f}s{r.timeout:>6.0f}s")
    return "\n".join(out)


def arguments(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The parsed command line and the instances asked for, each checked to exist."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20, help="members of the family")
    parser.add_argument("--seed", type=int, default=0, help="the family's seed")
    parser.add_argument("--instances", default="",
                        help="comma-separated members (by name) and public instances "
                             "(A, G, M, S); default: every member")
    parser.add_argument("--scale-timeout", type=float, default=1.0)
    parser.add_argument("--public", action="store_true",
                        help="add the public instances A, G, M, S from --dir")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help="folder of asplos-2025-iopddl-{A,G,M,S}.json.gz")
    parser.add_argument("--long", action="store_true",
                        help="run --factor times each limit and record the best costs")
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--record", type=Path, default=RECORD, help="best costs (JSON)")
    # Beside benchmarks/iopddl.py's logs, in a folder git ignores.
    parser.add_argument("--logs", type=Path, default=Path("iopddl-logs") / "family",
                        help="folder for each run's progress lines")
    parser.add_argument("--quick", action="store_true",
                        help=f"members {', '.join(QUICK_INSTANCES)}, {QUICK_TIMEOUT:g} s each")
    args = parser.parse_args(argv)
    if args.quick:
        args.instances, args.count, args.seed = ",".join(QUICK_INSTANCES), 20, 0
    members = [m.name for m in family_members(args.count, args.seed)]
    names = [n.strip() for n in args.instances.split(",") if n.strip()] or members
    if args.public and not args.quick:
        names += [n for n in INSTANCES if n not in names]
    unknown = [n for n in names if n not in members and n not in INSTANCES]
    if unknown:
        parser.error(f"unknown instances {unknown}: members are {members}, the public "
                     f"ones {sorted(INSTANCES)}")
    public = [n for n in names if n in INSTANCES]
    if public and (args.dir is None or not all(instance_path(args.dir, n).is_file()
                                               for n in public)):
        parser.error(f"public instances {public} asked for, but --dir {args.dir} does not "
                     "hold asplos-2025-iopddl-{A,G,M,S}.json.gz")
    return args, names


def run_all(args: argparse.Namespace, names: list[str], folder: Path) -> list[Result]:
    """Each named instance solved once, printed as it ends; the record updated after
    each generated one when `--long`."""
    by_name = {m.name: m for m in family_members(args.count, args.seed)}
    factor = args.factor if args.long else 1.0
    results = []
    for name in names:
        if name in INSTANCES:
            timeout, best = INSTANCES[name]
            path = instance_path(args.dir, name)
            problem, digest = load_iopddl(path), None
        else:
            member: Instance = by_name[name]
            problem = member.build()
            path = write_iopddl(problem, folder / f"{name}.json")
            timeout, digest = member.timeout, fingerprint(path)
            best = recorded_best(read_record(args.record), name, digest)
        if args.quick and not args.long:
            timeout = QUICK_TIMEOUT
        result = run_one(name, problem, path, timeout * args.scale_timeout * factor, best,
                         args.logs)
        if args.long and digest is not None:
            record = merged(read_record(args.record), result, digest)
            args.record.parent.mkdir(parents=True, exist_ok=True)
            args.record.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        results.append(result)
        print(table([result]).splitlines()[-1], flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args, names = arguments(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="solver-family-") as folder:
        results = run_all(args, names, Path(folder))
    print()
    print(table(results))
    print()
    print(f"average points over {len(results)} instances: "
          f"{statistics.mean(r.points for r in results):.4f}")
    if any(r.new_best for r in results):
        print("* this run's cost is the best known" +
              (f"; recorded in {args.record}" if args.long else " (not recorded: --long "
                                                                "records)"))
    late = [r for r in results if r.seconds > r.timeout]
    print(f"runs past their limit: {len(late)}; answers that do not fit: "
          f"{sum(not r.fits for r in results)}")
    return 0 if not late and all(r.fits for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
