"""User-facing errors.

Every error a user can cause derives from `AutoparError` and says three things: what was
expected, what was given, and how to fix it. Each subclass is also a `ValueError` or
`TypeError` so callers that catch the builtin kinds keep working. Internal invariants use
`assert`, never these classes.
"""

from __future__ import annotations


class AutoparError(Exception):
    """Base class of every error autopar raises on bad input."""

    def __init__(self, what: str, *, expected: str | None = None, got: str | None = None,
                 fix: str | None = None) -> None:
        self.what, self.expected, self.got, self.fix = what, expected, got, fix
        parts = [what]
        if expected is not None:
            parts.append(f"expected: {expected}")
        if got is not None:
            parts.append(f"got: {got}")
        if fix is not None:
            parts.append(f"fix: {fix}")
        super().__init__("\n  ".join(parts))

    def __reduce__(self):
        # Subclasses add keyword-only fields: rebuild from the attributes, not from args,
        # so an error raised on one rank can be sent to the others.
        return _restore, (type(self), str(self), self.__dict__)


def _restore(cls: type, message: str, state: dict) -> AutoparError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class MeshError(AutoparError, ValueError):
    """A mesh whose shape, axis names or link mapping is invalid or does not match."""


class HardwareError(AutoparError, ValueError):
    """An unknown or malformed hardware profile."""


class CaptureError(AutoparError, TypeError):
    """The model could not be captured as a graph by torch.export."""


class LossError(AutoparError, ValueError):
    """A model whose forward does not return a training loss autopar can find."""


class PlanningError(AutoparError, RuntimeError):
    """Planning failed on the rank that plans for the others (its own error could not be
    sent to them as itself)."""


class ShardingError(AutoparError, ValueError):
    """A requested placement is impossible for the tensor it is asked of."""


class InfeasiblePlanError(AutoparError, ValueError):
    """No plan fits in the device memory; `min_bytes` is the least memory any plan needs."""

    def __init__(self, what: str, *, min_bytes: float | None = None, **kwargs: str) -> None:
        self.min_bytes = min_bytes
        super().__init__(what, **kwargs)


class PlanFormatError(AutoparError, ValueError):
    """A plan file that is corrupt, or written by a newer autopar."""


class ProblemFormatError(AutoparError, ValueError):
    """A sharding-problem file (IOPDDL format) that is malformed."""


class ModelFileError(AutoparError, ValueError):
    """A model file given to the CLI that can't be loaded or has no `build()`."""


class InputMismatchError(AutoparError, ValueError):
    """Inputs to a compiled model whose structure, shapes or dtypes differ from the example
    inputs it was compiled for."""


class InitializationError(AutoparError, ValueError):
    """Parameters or buffers of a model that can't be given values (meta tensors with no
    way to initialise them)."""


class ReportError(AutoparError, ValueError):
    """A plan report that cannot be written where it was asked to go."""


class TrainingRunError(AutoparError, ValueError):
    """A training configuration with a value that cannot run (steps, learning rate)."""


class OptimizerError(AutoparError, ValueError):
    """An optimizer whose state the cost model cannot size, or a bad precision recipe."""


class MicrobatchError(AutoparError, ValueError):
    """A training step that cannot run as the micro-batches asked for: a count that does not
    divide the batch, or a model whose loss or ops mix the samples of the batch."""


class PipelineError(AutoparError, ValueError):
    """A pipeline request the model, mesh or torch's schedules can't satisfy: an unknown
    schedule, more stages than blocks, micro-batches a schedule can't run."""


class CheckpointError(AutoparError, ValueError):
    """A checkpoint that can't be saved or loaded: a missing or incomplete one, one of
    another model, or an optimizer that doesn't match it."""


class GenerationError(AutoparError, ValueError):
    """A generation that can't run: a model without a KV cache autopar can hold, a program
    planned for training, a prompt or a length the cache can't take."""
