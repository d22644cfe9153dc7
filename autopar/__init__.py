"""autopar: automatic parallelization of PyTorch models."""

from importlib import import_module

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

# The rest is imported on first use (PEP 562): `autopar solve` and other torch-free uses
# of the package (the solver) start in a fraction of a second instead of importing torch.
_LAZY = {
    "plan": "autopar.api", "check": "autopar.check", "compile": "autopar.compiler",
    "HardwareProfile": "autopar.hardware", "available_hardware": "autopar.hardware",
    "load_hardware": "autopar.hardware", "Mesh": "autopar.mesh",
    "MasterWeights": "autopar.mixed_precision", "master_weights": "autopar.mixed_precision",
    "Pipeline": "autopar.pipeline", "Plan": "autopar.plan_types",
    "launch": "autopar.runtime.launch", "ParallelModule": "autopar.runtime.parallel_module",
}


def __getattr__(name: str):
    if name == "checkpoint":
        return import_module("autopar.checkpoint")
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autopar' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AutoparError", "CaptureError", "CheckpointError", "HardwareError", "HardwareProfile",
    "InfeasiblePlanError", "InitializationError", "InputMismatchError", "MasterWeights", "Mesh",
    "MeshError", "MicrobatchError", "ModelFileError", "OptimizerError", "ParallelModule",
    "Pipeline", "PipelineError", "Plan", "PlanFormatError", "ProblemFormatError",
    "ReportError", "ShardingError", "TrainingRunError", "available_hardware", "check",
    "checkpoint", "compile", "launch", "load_hardware", "master_weights", "plan",
]
