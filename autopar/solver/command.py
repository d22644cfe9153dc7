"""`autopar solve FILE --timeout S`: solve an IOPDDL problem file, contest style.

Output: with `progress`, the solve's progress lines (clock, objective, bound, gap; see
`progress.py`) starting with "#"; then a "#" summary line, the cost, and as the last line
the chosen strategy index of every node as a bracketed list (`[]` when none was found),
which is the contest's answer format. The timeout is the whole process's: the
interpreter's start-up and the loading of the file count against it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

from autopar.solver.iopddl import load_iopddl
from autopar.solver.solve import solve


def _number(value: float) -> str:
    if math.isfinite(value) and float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def process_age() -> float:
    """Seconds since this process started (from /proc on Linux; 0 where that is not
    readable, so the clock then starts at the call)."""
    try:
        with open("/proc/self/stat") as stat:
            # Field 22 (after the parenthesised name, which may hold spaces): start time
            # in clock ticks after boot.
            started = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as uptime:
            now = float(uptime.read().split()[0])
        return max(now - started / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


def solve_command(path: str, timeout: float, echo: Callable[[str], None] = print, *,
                  progress: bool = False) -> int:
    """Solve the problem in `path` so that the process ends within `timeout` seconds of
    its start; exit code 0, or 1 if no assignment was found."""
    start = time.monotonic() - process_age()
    problem = load_iopddl(path)
    loaded = time.monotonic() - start
    say = (lambda line: echo(f"# {line}")) if progress else None
    if say:
        say(f"{problem.name}: {problem.num_nodes} nodes, {problem.num_edges} edges, "
            f"started and loaded in {loaded:.1f} s")
    # Keep back a little for expanding the answer, printing it and the interpreter's exit:
    # a second at least (a 5 s run ended 0.1 s late on 2 shared cores with half of one).
    budget = timeout - loaded - max(1.0, 0.02 * timeout)
    solution = solve(problem, time_limit=max(budget, 0.1), progress=say)
    echo(f"# status {solution.status}, bound {_number(solution.bound)}, "
         f"gap {solution.gap:.3%}, {time.monotonic() - start:.1f} s since the process began")
    echo(_number(solution.cost))
    echo("[" + ", ".join(str(k) for k in solution.choices) + "]")
    return 0 if solution.choices else 1
