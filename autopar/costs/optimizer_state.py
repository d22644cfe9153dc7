"""What training keeps per parameter element besides the parameter: its gradient, the
optimizer's states and, under mixed precision, a master copy.

    bytes per element = parameter (its dtype) + gradient (its dtype)
                        + master copy (master dtype, when mixed precision)
                        + states x (state dtype: the master dtype, else the parameter's)

torch's optimizers keep their states in the parameter's dtype, so a bfloat16 model trained
by plain AdamW keeps 2 + 2 + 2 x 2 bytes per element; the Megatron/DeepSpeed recipe (bf16
compute, fp32 master weights and states) keeps 2 + 2 + 4 + 2 x 4. The gradient, master
copy and states live where the optimizer steps the parameter (its storage placement, which
is sharded under ZeRO); the parameter where the model computes with it.

`optimizer_state(spec)` reads the optimizer the user trains with: a torch optimizer class
(`torch.optim.AdamW`), a class with its options (`(torch.optim.SGD, {"momentum": 0.9})`),
an `OptimizerState`, or a number of state bytes per parameter element (for optimizers it
does not know). Unknown optimizers raise `OptimizerError` saying to give that number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from autopar.errors import OptimizerError


@dataclass(frozen=True)
class OptimizerState:
    """The optimizer's per-element state: `states` tensors shaped like the parameter (in
    `state_dtype`, None: the parameter's), or exactly `state_bytes` per element when given;
    `master_dtype` is the dtype of a master copy of the weights (mixed precision), None for
    none. `name` is how summaries state it."""

    name: str
    states: int = 0
    state_dtype: torch.dtype | None = None
    state_bytes: float | None = None
    master_dtype: torch.dtype | None = None
    # Parameter-sized temporaries (in the state dtype) torch's step of one tensor holds at
    # its peak: Adam's `exp_avg_sq.sqrt()` and its quotient by the bias correction. The
    # multi-tensor step makes the first for every tensor at once, the others in place.
    temporaries: int = 0

    def __post_init__(self) -> None:
        if self.states < 0 or (self.state_bytes is not None and self.state_bytes < 0):
            raise OptimizerError(f"optimizer state of {self.name!r} is negative",
                                 expected="states >= 0 and state_bytes >= 0",
                                 got=f"states={self.states}, state_bytes={self.state_bytes}",
                                 fix="give the number of parameter-sized state tensors")
        for dtype in (self.state_dtype, self.master_dtype):
            if dtype is not None and not (isinstance(dtype, torch.dtype)
                                          and dtype.is_floating_point):
                raise OptimizerError("optimizer state and master weights need a float dtype",
                                     expected="e.g. torch.float32", got=repr(dtype),
                                     fix="pass a floating-point torch.dtype")

    def element_bytes(self, param_dtype: torch.dtype) -> float:
        """Bytes per parameter element of the master copy and the states (not the
        parameter or its gradient)."""
        master = self.master_dtype.itemsize if self.master_dtype is not None else 0
        if self.state_bytes is not None:
            return master + self.state_bytes
        dtype = self.state_dtype or self.master_dtype or param_dtype
        return master + self.states * dtype.itemsize

    def temporary_bytes(self, param_dtype: torch.dtype, *, multi_tensor: bool) -> float:
        """Bytes per parameter element of the temporaries the step holds at once: all of
        one tensor's, stepping one tensor at a time; the first of every tensor's,
        multi-tensor."""
        if self.state_bytes is not None or not self.temporaries:
            return 0.0
        dtype = self.state_dtype or self.master_dtype or param_dtype
        return (1 if multi_tensor else self.temporaries) * dtype.itemsize

    def with_master_weights(self, dtype: torch.dtype | None) -> OptimizerState:
        """The same optimizer stepping a `dtype` master copy, its states in that dtype."""
        if dtype is None:
            return self
        return OptimizerState(f"{self.name}, {_dtype_name(dtype)} master weights",
                              self.states, self.state_dtype or dtype, self.state_bytes, dtype,
                              self.temporaries)

    def describe(self) -> str:
        if self.state_bytes is not None:
            states = f"{self.state_bytes:g} state bytes per element"
        else:
            dtype = self.state_dtype or self.master_dtype
            where = _dtype_name(dtype) if dtype is not None else "the parameter's dtype"
            states = f"{self.states} state{'s' if self.states != 1 else ''} in {where}"
        return f"{self.name} ({states})"

    def to_dict(self) -> dict:
        return {"name": self.name, "states": self.states,
                "state_dtype": _dtype_name(self.state_dtype), "state_bytes": self.state_bytes,
                "master_dtype": _dtype_name(self.master_dtype),
                "temporaries": self.temporaries}

    @classmethod
    def from_dict(cls, data: dict) -> OptimizerState:
        return cls(data["name"], data["states"], _dtype(data["state_dtype"]),
                   data["state_bytes"], _dtype(data["master_dtype"]), data.get("temporaries", 0))


ADAMW = OptimizerState("AdamW", states=2, temporaries=2)


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _dtype(name: str | None) -> torch.dtype | None:
    return None if name is None else getattr(torch, name)


def _count_states(cls: type, options: Mapping) -> int | None:
    """Parameter-sized state tensors torch's `cls` keeps with `options` (None: unknown)."""
    def option(name: str, default):
        value = options.get(name, default)
        return value if value is not None else default

    optim = torch.optim
    if cls is optim.SGD:
        return 1 if option("momentum", 0) else 0
    if cls in (optim.Adam, optim.AdamW):
        return 3 if option("amsgrad", False) else 2  # moments, and max_exp_avg_sq
    if cls in (optim.NAdam, optim.RAdam, optim.Adamax, optim.Adadelta):
        return 2
    if cls is optim.Adagrad:
        return 1
    if cls is optim.RMSprop:
        return 1 + bool(option("momentum", 0)) + bool(option("centered", False))
    if cls is optim.ASGD:
        return 2  # ax and eta/mu are scalars; ax is parameter-sized, plus the step average
    if cls is optim.Rprop:
        return 2  # prev and step_size
    return None


def optimizer_state(spec: object = None, *,
                    master_weights: torch.dtype | None = None) -> OptimizerState:
    """The `OptimizerState` of `spec` (see the module docstring; None: AdamW), stepping a
    `master_weights` copy when given (mixed precision)."""
    if master_weights is not None and not (isinstance(master_weights, torch.dtype)
                                           and master_weights.is_floating_point):
        raise OptimizerError("master_weights must be a floating-point dtype",
                             expected="torch.float32 (or None: the model's own dtype)",
                             got=repr(master_weights), fix="pass master_weights=torch.float32")
    return _parse(spec).with_master_weights(master_weights)


def _parse(spec: object) -> OptimizerState:
    if spec is None:
        return ADAMW
    if isinstance(spec, OptimizerState):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return OptimizerState(f"optimizer with {spec:g} state bytes per element",
                              state_bytes=float(spec))
    cls, options = (spec if isinstance(spec, tuple) and len(spec) == 2
                    and isinstance(spec[1], Mapping) else (spec, {}))
    if isinstance(cls, torch.optim.Optimizer):
        cls, options = type(cls), cls.defaults
    if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer):
        states = _count_states(cls, options)
        if states is not None:
            adam = cls in (torch.optim.Adam, torch.optim.AdamW)
            return OptimizerState(cls.__name__, states=states, temporaries=2 if adam else 0)
        raise OptimizerError(
            f"the cost model does not know the state of {cls.__name__}",
            expected="SGD, Adam, AdamW, NAdam, RAdam, Adamax, Adadelta, Adagrad, RMSprop, "
                     "ASGD or Rprop",
            got=cls.__name__,
            fix="give its state size instead: optimizer=<bytes per parameter element>, "
                "e.g. 8 for two fp32 moments")
    raise OptimizerError(
        "optimizer must be a torch optimizer class, (class, options), an OptimizerState or "
        "a number of state bytes per parameter element", expected="e.g. torch.optim.AdamW",
        got=repr(spec)[:80], fix="pass optimizer=torch.optim.AdamW, or a number such as 8")
