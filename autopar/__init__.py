"""autopar: automatic parallelization of PyTorch models."""

from importlib import import_module

from autopar.errors import (
    AutoparError,
    CaptureError,
    CheckpointError,
    GenerationError,
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
_LAZY = {  # public name -> (module, attribute)
    "plan": ("autopar.planning.entry", "plan"), "check": ("autopar.tools.coverage", "check"),
    "compile": ("autopar.compiler", "compile"),
    "HardwareProfile": ("autopar.values.hardware", "HardwareProfile"),
    "available_hardware": ("autopar.values.hardware", "available_hardware"),
    "load_hardware": ("autopar.values.hardware", "load_hardware"),
    "Mesh": ("autopar.values.mesh", "Mesh"),
    "MasterWeights": ("autopar.runtime.master_weights", "MasterWeights"),
    "master_weights": ("autopar.runtime.master_weights", "master_weights"),
    "Pipeline": ("autopar.values.pipeline", "Pipeline"), "Plan": ("autopar.values.plan", "Plan"),
    "launch": ("autopar.runtime.launch", "launch"),
    "ParallelModule": ("autopar.runtime.parallel_module", "ParallelModule"),
    "summary": ("autopar.present.summary", "render_summary"),
    "report": ("autopar.present.report", "write_report"),
    "to_dot": ("autopar.present.report", "to_dot"),
    "measure": ("autopar.tools.measure", "measure"),
    "CachedLM": ("autopar.tools.kv_cache", "CachedLM"),
    "generate": ("autopar.tools.generate", "generate"),
    "compile_prefill": ("autopar.tools.generate", "compile_prefill"),
    "Measurement": ("autopar.values.measurement", "Measurement"),
}
# Modules of the public API, and the packages, reached as attributes (`autopar.runtime`).
_MODULES = {"checkpoint": "autopar.tools.checkpoint"} | {name: f"autopar.{name}" for name in (
    "cli", "costs", "passes", "planning", "present", "rules", "runtime", "solver", "tools",
    "values")}


def __getattr__(name: str):
    if name in _MODULES:
        return import_module(_MODULES[name])
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(import_module(module), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autopar' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AutoparError", "CachedLM", "CaptureError", "CheckpointError", "GenerationError",
    "HardwareError", "HardwareProfile",
    "InfeasiblePlanError", "InitializationError", "InputMismatchError", "MasterWeights", "Mesh",
    "MeshError", "MicrobatchError", "ModelFileError", "OptimizerError", "ParallelModule",
    "Pipeline", "PipelineError", "Plan", "PlanFormatError", "ProblemFormatError",
    "ReportError", "ShardingError", "TrainingRunError", "available_hardware", "check",
    "checkpoint", "compile", "compile_prefill", "generate", "launch", "load_hardware",
    "master_weights", "plan", "report",
    "summary", "to_dot",
]
