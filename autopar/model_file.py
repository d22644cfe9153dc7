"""Load a model from a Python file exposing `build() -> (model, example_inputs)`."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch.nn as nn

from autopar.errors import ModelFileError


def _importable(path: Path) -> tuple[Path, str]:
    """The folder to put on sys.path and the dotted module name of `path`: a file inside
    packages (folders with `__init__.py`) is imported as part of them, so its own
    package-relative imports (`from examples import ...`) work."""
    parts, folder = [path.stem], path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return folder, ".".join(parts)


def load_model_file(path: str | Path, **config) -> tuple[nn.Module, tuple]:
    """Import `path` as a module and call its `build(**config)`."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".py":
        raise ModelFileError(f"model file {path} not found", expected="a path to a .py file",
                             got=str(path), fix="e.g. autopar plan examples/gpt.py")
    root, name = _importable(path.resolve())
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # the user's file failed to import: say so, not a traceback
        raise ModelFileError(f"importing {path} failed: {type(exc).__name__}: {exc}",
                             expected="a Python file that imports cleanly",
                             got=f"{type(exc).__name__} while importing {name}",
                             fix="run `python FILE.py` to see the full error") from exc
    finally:
        sys.path.remove(str(root))
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
