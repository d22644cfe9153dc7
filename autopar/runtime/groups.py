"""`device_mesh`: the torch DeviceMesh of an `autopar.Mesh`, over the default process group.

The mesh's axes become DeviceMesh dims with the same names, so `get_group(axis)` is the
process group of one mesh axis, and rank r sits at the row-major coordinate of r in the
mesh shape (torch's layout). Process groups are created by torch's `init_device_mesh`; this
module only checks that the world matches the mesh first.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autopar.runtime.errors import ProcessGroupError
from autopar.values.mesh import Mesh


def device_type() -> str:
    """"cuda" when the default group runs NCCL on a CUDA build, else "cpu"."""
    if torch.cuda.is_available() and "nccl" in str(dist.get_backend()):
        return "cuda"
    return "cpu"


def device_mesh(mesh: Mesh) -> DeviceMesh:
    """A DeviceMesh of `mesh.shape` named `mesh.axis_names` over all ranks.

    Collective: every rank calls it, once per mesh (each call creates new process groups).
    Raises `ProcessGroupError` when torch.distributed is not initialised or its world size
    differs from `mesh.size`.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise ProcessGroupError(
            "torch.distributed is not initialised",
            expected=f"a default process group of {mesh.size} ranks for mesh {mesh.shape}",
            got="no process group",
            fix="run under torchrun and call autopar.runtime.init_from_env(), "
                "or start the ranks with autopar.runtime.launch.launch(fn, nprocs)")
    world = dist.get_world_size()
    if world != mesh.size:
        raise ProcessGroupError(
            "the process group's world size does not match the mesh",
            expected=f"{mesh.size} ranks for mesh {'x'.join(map(str, mesh.shape))} "
                     f"{mesh.axis_names}",
            got=f"world size {world}",
            fix=f"start {mesh.size} processes, or plan for a mesh of {world} devices")
    return init_device_mesh(device_type(), mesh.shape, mesh_dim_names=mesh.axis_names)
