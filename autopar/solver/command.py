"""`autopar solve FILE --timeout S`: solve an IOPDDL problem file, contest style.

Output: progress lines starting with "#", then the cost, then as the last line the chosen
strategy index of every node as a bracketed list (`[]` when none was found), which is
the contest's answer format. Loading counts against the timeout.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from autopar.solver.iopddl import load_iopddl
from autopar.solver.solve import solve


def _number(value: float) -> str:
    if math.isfinite(value) and float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def solve_command(path: str, timeout: float, echo: Callable[[str], None] = print) -> int:
    """Solve the problem in `path` within `timeout` seconds; exit code 0, or 1 if none found."""
    start = time.monotonic()
    problem = load_iopddl(path)
    loaded = time.monotonic() - start
    echo(f"# {problem.name}: {problem.num_nodes} nodes, {problem.num_edges} edges, "
         f"loaded in {loaded:.1f} s")
    # Keep back a little for expanding the answer and printing it.
    budget = timeout - loaded - max(0.5, 0.02 * timeout)
    solution = solve(problem, time_limit=max(budget, 0.1),
                     progress=lambda line: echo(f"# {line}"))
    echo(f"# status {solution.status}, bound {_number(solution.bound)}, "
         f"gap {solution.gap:.3%}, {time.monotonic() - start:.1f} s in all")
    echo(_number(solution.cost))
    echo("[" + ", ".join(str(k) for k in solution.choices) + "]")
    return 0 if solution.choices else 1
