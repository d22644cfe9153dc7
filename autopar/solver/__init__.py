"""The sharding-problem solver: `ShardingProblem` (with `EdgeUsage`), `solve`, `Solution`,
IOPDDL loading."""

from autopar.solver.iopddl import load_iopddl
from autopar.solver.problem import EdgeUsage, ShardingProblem
from autopar.solver.solution import Solution
from autopar.solver.solve import min_peak_usage, solve

__all__ = ["EdgeUsage", "ShardingProblem", "Solution", "load_iopddl", "min_peak_usage", "solve"]
