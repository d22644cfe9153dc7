"""Load a model from a Python file exposing `build() -> (model, example_inputs)`."""

from __future__ import annotations

import difflib
import importlib
import inspect
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


def _check_config(path: Path, build: object, config: dict) -> None:
    """Refuse keys `build` does not take, listing those it does (unless it takes **kwargs)."""
    try:
        parameters = inspect.signature(build).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function: let the call say it
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    accepted = [p.name for p in parameters
                if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                              inspect.Parameter.KEYWORD_ONLY)]
    unknown = [key for key in config if key not in accepted]
    if unknown:
        close = {key: difflib.get_close_matches(key, accepted, n=1) for key in unknown}
        hints = [f"{key} -> {match[0]}" for key, match in close.items() if match]
        raise ModelFileError(
            f"{path}: build() takes no argument {', '.join(map(repr, unknown))}",
            expected=f"--set KEY=VALUE with KEY among: {', '.join(accepted) or '(none)'}",
            got=", ".join(f"{key}={config[key]!r}" for key in unknown),
            fix=("did you mean " + ", ".join(hints) + "?") if hints else
                "use one of the keys build() accepts")


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
    _check_config(path, build, config)
    result = build(**config)
    if (not isinstance(result, tuple) or len(result) != 2
            or not isinstance(result[0], nn.Module)):
        raise ModelFileError(f"{path}: build() must return (nn.Module, tuple of inputs)",
                             expected="(model, example_inputs)", got=type(result).__name__,
                             fix="return model, (input1, input2, ...)")
    model, inputs = result
    return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
