"""autopar: automatic parallelization of PyTorch models."""

from autopar.errors import (
    AutoparError,
    CaptureError,
    HardwareError,
    InfeasiblePlanError,
    MeshError,
    PlanFormatError,
    ProblemFormatError,
    ShardingError,
)
from autopar.hardware import HardwareProfile, available_hardware, load_hardware
from autopar.mesh import Mesh

__all__ = [
    "AutoparError", "CaptureError", "HardwareError", "HardwareProfile", "InfeasiblePlanError",
    "Mesh", "MeshError", "PlanFormatError", "ProblemFormatError", "ShardingError",
    "available_hardware", "load_hardware",
]
