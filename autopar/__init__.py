"""autopar: automatic parallelization of PyTorch models."""

from autopar.api import plan
from autopar.errors import (
    AutoparError,
    CaptureError,
    HardwareError,
    InfeasiblePlanError,
    MeshError,
    ModelFileError,
    PlanFormatError,
    ProblemFormatError,
    ShardingError,
)
from autopar.hardware import HardwareProfile, available_hardware, load_hardware
from autopar.mesh import Mesh
from autopar.plan_types import Plan
from autopar.runtime.launch import launch

__all__ = [
    "AutoparError", "CaptureError", "HardwareError", "HardwareProfile", "InfeasiblePlanError",
    "Mesh", "MeshError", "ModelFileError", "Plan", "PlanFormatError", "plan", "ProblemFormatError",
    "ShardingError",
    "available_hardware", "launch", "load_hardware",
]
