"""The distributed runtime: starting ranks, meshes of process groups, and the
autograd-aware collectives that move tensors between placements.

- `launch.launch(fn, nprocs, *args)` / `init_from_env()`: ranks on one machine, or under
  torchrun. (The function is not re-exported here, so that `autopar.runtime.launch` stays
  the module, with `autopar.runtime.launch.init_from_env` in it.) Both make CPU ranks'
  malloc keep the memory they free (`keep_freed_memory`): steps stop page-faulting it back.
- `device_mesh(mesh)`: the torch DeviceMesh of an `autopar.Mesh`.
- `Redistribution.for_edge(...)` + `redistribute(x, r, mesh, counter)`: one graph edge's
  conversion, forward and backward, performing exactly the collectives the cost model
  charges; `CommCounter` measures them; `Regather` frees gathered parameters for backward,
  `Recompute` the outputs of ops the plan computes again in the backward.
- `parallel_module.ParallelModule`: a compiled rank's model (built by `autopar.compile`),
  over its pieces of the state (`shards`, `materialize`), with parameter gradients
  all-reduced in the background of the backward (`grad_reduce`), and outputs summed over
  the ranks returned as `PendingSum`s that complete in the background too (`pending`).
"""

from autopar.runtime.allocator import keep_freed_memory
from autopar.runtime.collectives import redistribute
from autopar.runtime.counter import CommCounter, transfer_totals
from autopar.runtime.errors import (
    LaunchArgumentError,
    LaunchError,
    ProcessGroupError,
    RedistributionError,
    UnsupportedRedistributionError,
)
from autopar.runtime.groups import device_mesh
from autopar.runtime.launch import init_from_env
from autopar.runtime.pending import PendingSum
from autopar.runtime.recompute import Recompute
from autopar.runtime.redistribution import Redistribution
from autopar.runtime.regather import Regather
from autopar.runtime.steps import Step, redistribution_steps
from autopar.values.placement import local_shape

__all__ = [
    "CommCounter", "LaunchArgumentError", "LaunchError", "PendingSum", "ProcessGroupError",
    "Recompute", "Redistribution",
    "RedistributionError", "Regather", "Step", "UnsupportedRedistributionError", "device_mesh",
    "init_from_env", "keep_freed_memory", "local_shape", "redistribution_steps", "redistribute",
    "transfer_totals",
]
