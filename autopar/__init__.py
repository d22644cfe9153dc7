"""autopar: automatic parallelization of PyTorch models."""

from autopar import checkpoint
from autopar.api import plan
from autopar.check import check
from autopar.compiler import compile
from autopar.errors import (
    AutoparError,
    CaptureError,
    CheckpointError,
    HardwareError,
    InfeasiblePlanError,
    InitializationError,
    InputMismatchError,
    MeshError,
    MicrobatchError,
    ModelFileError,
    OptimizerError,
    PipelineError,
    PlanFormatError,
    ProblemFormatError,
    ReportError,
    ShardingError,
    TrainingRunError,
)
from autopar.hardware import HardwareProfile, available_hardware, load_hardware
from autopar.mesh import Mesh
from autopar.mixed_precision import MasterWeights, master_weights
from autopar.pipeline import Pipeline
from autopar.plan_types import Plan
from autopar.runtime.launch import launch
from autopar.runtime.parallel_module import ParallelModule

__all__ = [
    "AutoparError", "CaptureError", "CheckpointError", "HardwareError", "HardwareProfile",
    "InfeasiblePlanError", "InitializationError", "InputMismatchError", "MasterWeights", "Mesh",
    "MeshError", "MicrobatchError", "ModelFileError", "OptimizerError", "ParallelModule",
    "Pipeline", "PipelineError", "Plan", "PlanFormatError", "ProblemFormatError",
    "ReportError", "ShardingError", "TrainingRunError", "available_hardware", "check",
    "checkpoint", "compile", "launch", "load_hardware", "master_weights", "plan",
]
