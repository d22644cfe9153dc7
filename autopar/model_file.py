"""Load a model from a Python file exposing `build() -> (model, example_inputs)`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch.nn as nn

from autopar.errors import ModelFileError


def load_model_file(path: str | Path, **config) -> tuple[nn.Module, tuple]:
    """Import `path` as a module and call its `build(**config)`."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".py":
        raise ModelFileError(f"model file {path} not found", expected="a path to a .py file",
                             got=str(path), fix="e.g. autopar plan examples/gpt.py")
    spec = importlib.util.spec_from_file_location(f"autopar_model_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    build = getattr(module, "build", None)
    if not callable(build):
        raise ModelFileError(f"{path} has no build() function",
                             expected="def build(**config) -> (model, example_inputs)",
                             got=", ".join(n for n in vars(module) if not n.startswith("_")),
                             fix="add a build() returning the model and a tuple of inputs")
    result = build(**config)
    if (not isinstance(result, tuple) or len(result) != 2
            or not isinstance(result[0], nn.Module)):
        raise ModelFileError(f"{path}: build() must return (nn.Module, tuple of inputs)",
                             expected="(model, example_inputs)", got=type(result).__name__,
                             fix="return model, (input1, input2, ...)")
    model, inputs = result
    return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
