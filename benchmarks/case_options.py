"""The command line the case benchmarks share: `--case` (repeatable, among the benchmark's
cases), `--time-limit`, and `--quick`, which stands for a few cases at a short limit."""

from __future__ import annotations

import argparse
from collections.abc import Iterable


def case_parser(description: str, cases: Iterable[str], time_limit: float,
                quick: tuple[tuple[str, ...], float]) -> argparse.ArgumentParser:
    """A parser of `--case` (one of `cases`, repeatable), `--time-limit` (default
    `time_limit`) and `--quick`: `quick`'s (cases, time limit) in place of both."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--case", choices=sorted(cases), action="append")
    parser.add_argument("--time-limit", type=float, default=time_limit)
    names, limit = quick
    parser.add_argument("--quick", action="store_true",
                        help=f"--case {' '.join(names)} --time-limit {limit:g}, in place of "
                             "the options above")
    parser.set_defaults(quick_cases=quick)
    return parser


def parse_cases(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """`parser`'s arguments, `--quick` applied to `case` and `time_limit`."""
    args = parser.parse_args()
    if args.quick:
        args.case, args.time_limit = (list(args.quick_cases[0]), args.quick_cases[1])
    return args
