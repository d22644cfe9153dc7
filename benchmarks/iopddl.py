"""Solve the public IOPDDL instances as the contest did and print a table.

    python benchmarks/iopddl.py [--instances A,G] [--runs 3] [--scale-timeout 1.0] [--dir PATH]
    python benchmarks/iopddl.py --quick   # instance G, kept in tests/solver/data: one 5 s run

The instances (asplos-2025-iopddl-{A,G,M,S}.json.gz, google/iopddl's public set, 0.1 to
1.9 MB each) are read from `--dir`, by default `../shared/benchmarks/iopddl` beside the
repository when that folder exists. `--quick` solves the copy of G in `tests/solver/data`
(see its README) with a 5 s limit instead of the contest's 120 s.

Each run is a fresh `autopar solve FILE --timeout T --progress` process, timed from outside
(start-up, loading and exit count, as in the contest). Per run: the cost, whether it fits
in memory (checked here, not taken from the solver), points = best known cost / our cost
(the contest's score; 1.0 = best any team reached), the solver's own status, bound and gap,
and the process's wall time against the limit. Then each instance's points over its runs
and the average over instances.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autopar.solver import load_iopddl  # noqa: E402

# The public instances, kept beside the repository (not in it: up to 1.9 MB each).
SHARED_DIR = ROOT.parent / "shared" / "benchmarks" / "iopddl"
DEFAULT_DIR = SHARED_DIR if SHARED_DIR.is_dir() else None
# `--quick`: instance G, kept in the repository, solved once with a short limit.
QUICK_DIR, QUICK_INSTANCES, QUICK_TIMEOUT = ROOT / "tests" / "solver" / "data", "G", 5.0
# Timeout in seconds and best known cost, from the benchmark's README.
INSTANCES = {"A": (60, 6_548_641_531), "G": (120, 217_039),
             "M": (180, 49_928_460_991), "S": (240, 1_534_613_444)}
SUMMARY = re.compile(r"# status (\w+), bound (\S+), gap (\S+),")


@dataclass(frozen=True)
class Run:
    name: str
    index: int
    cost: float
    fits: bool
    points: float
    status: str
    gap: str
    seconds: float
    timeout: float


def autopar_command() -> list[str]:
    """The `autopar` command of this interpreter's environment, else `python -m autopar.cli`
    (the same command without its console script)."""
    script = Path(sys.executable).with_name("autopar")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "autopar.cli"]


def solve_once(name: str, path: Path, timeout: float, log: Path) -> tuple[list[int], float,
                                                                          str, str, float]:
    """Run `autopar solve` on `path`; its answer, cost, status, gap and wall seconds."""
    command = [*autopar_command(), "solve", str(path), "--timeout", f"{timeout:g}",
               "--progress"]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.monotonic() - start
    log.write_text(done.stdout + done.stderr)
    lines = done.stdout.strip().splitlines()
    found = next((m for m in map(SUMMARY.match, lines) if m), None)
    if done.returncode not in (0, 1) or len(lines) < 2 or found is None:
        raise SystemExit(f"autopar solve failed on {name} (exit {done.returncode}); "
                         f"see {log}")
    return (json.loads(lines[-1]), float(lines[-2]), found.group(1), found.group(3),
            seconds)


def table(runs: list[Run]) -> str:
    head = (f"{'inst':<5}{'run':>4}{'cost':>17}{'fits':>6}{'points':>8}{'status':>10}"
            f"{'gap':>10}{'time':>9}{'limit':>7}")
    out = [head, "-" * len(head)]
    for r in runs:
        out.append(f"{r.name:<5}{r.index:>4}{r.cost:>17.0f}{'yes' if r.fits else 'NO':>6}"
                   f"{r.points:>8.4f}{r.status:>10}{r.gap:>10}{r.seconds:>8.1f}s"
                   f"{r.timeout:>6.0f}s")
    return "\n".join(out)


def instance_path(folder: Path, name: str) -> Path:
    return folder / f"asplos-2025-iopddl-{name}.json.gz"


def arguments(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The parsed command line and the instances asked for, each checked to be there."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", default="A,G,M,S")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--scale-timeout", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help="folder of asplos-2025-iopddl-{A,G,M,S}.json.gz (default: "
                             f"{SHARED_DIR}, when it exists)")
    parser.add_argument("--logs", type=Path, default=Path("iopddl-logs"),
                        help="folder for each run's progress lines")
    parser.add_argument("--quick", action="store_true",
                        help=f"instance {QUICK_INSTANCES} from {QUICK_DIR.relative_to(ROOT)}, "
                             f"1 run of {QUICK_TIMEOUT:g} s, in place of --instances, --runs, "
                             "--scale-timeout and --dir")
    args = parser.parse_args(argv)
    if args.quick:
        args.instances, args.runs, args.dir = QUICK_INSTANCES, 1, QUICK_DIR
        args.scale_timeout = QUICK_TIMEOUT / INSTANCES[QUICK_INSTANCES][0]
    names = [n.strip().upper() for n in args.instances.split(",") if n.strip()]
    unknown = [n for n in names if n not in INSTANCES]
    if unknown:
        parser.error(f"unknown instances {unknown}; choose from {sorted(INSTANCES)}")
    if args.dir is None:
        parser.error(f"no folder of instances: the default, {SHARED_DIR}, does not exist. "
                     "Pass the folder that holds asplos-2025-iopddl-{A,G,M,S}.json.gz "
                     "(google/iopddl's public instances) as --dir PATH, or run --quick "
                     f"(instance {QUICK_INSTANCES}, kept in {QUICK_DIR.relative_to(ROOT)})")
    missing = [name for name in names if not instance_path(args.dir, name).is_file()]
    if missing:
        parser.error(f"no file {instance_path(args.dir, missing[0]).name} in {args.dir} "
                     f"(instances {','.join(missing)} missing): pass the folder that holds "
                     "asplos-2025-iopddl-{A,G,M,S}.json.gz as --dir PATH")
    return args, names


def main(argv: list[str] | None = None) -> int:
    args, names = arguments(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    by_instance: dict[str, list[Run]] = {}
    for name in names:
        timeout, best_known = INSTANCES[name]
        timeout *= args.scale_timeout
        path = instance_path(args.dir, name)
        problem = None
        for index in range(args.runs):
            choices, cost, status, gap, seconds = solve_once(
                name, path, timeout, args.logs / f"{name}-{index}.log")
            problem = problem or load_iopddl(path)
            fits = bool(choices) and problem.is_feasible(tuple(choices))
            checked = problem.cost(tuple(choices)) if fits else float("inf")
            points = best_known / checked if fits else 0.0
            run = Run(name, index, checked, fits, points, status, gap, seconds, timeout)
            by_instance.setdefault(name, []).append(run)
            print(table([run]).splitlines()[-1], flush=True)
    print()
    print(table([r for runs in by_instance.values() for r in runs]))
    print()
    means = {name: statistics.mean(r.points for r in runs) for name, runs in by_instance.items()}
    for name, runs in by_instance.items():
        print(f"{name}: points {' '.join(f'{r.points:.4f}' for r in runs)} "
              f"(mean {means[name]:.4f}); slowest run {max(r.seconds for r in runs):.1f} s "
              f"of {runs[0].timeout:.0f} s")
    print(f"average points over {len(means)} instances: {statistics.mean(means.values()):.4f}")
    late = [r for runs in by_instance.values() for r in runs if r.seconds > r.timeout]
    print(f"runs past their limit: {len(late)}")
    return 0 if not late and all(r.fits for runs in by_instance.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
