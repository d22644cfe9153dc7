"""The sharding-problem solver: `ShardingProblem`, `solve`, `Solution`, IOPDDL loading."""

from autopar.solver.iopddl import load_iopddl
from autopar.solver.problem import ShardingProblem
from autopar.solver.solution import Solution
from autopar.solver.solve import min_peak_usage, solve

__all__ = ["ShardingProblem", "Solution", "load_iopddl", "min_peak_usage", "solve"]
