"""Mixed-precision training with master weights: bf16 compute, fp32 optimizer (Megatron's
and DeepSpeed's recipe), around any torch optimizer and any module, compiled or not.

    pm = autopar.compile(model.to(torch.bfloat16), mesh, inputs,
                         optimizer=torch.optim.AdamW, master_weights=torch.float32)
    opt = autopar.master_weights(pm, torch.optim.AdamW, dtype=torch.float32, lr=1e-4)
    for _ in range(steps):
        loss = pm(*inputs); loss.backward(); opt.step(); opt.zero_grad()

`master_weights(module, optimizer_class, dtype=..., **options)` returns a `MasterWeights`:
it keeps a `dtype` copy (the master) of every trainable parameter narrower than `dtype`,
and a plain `optimizer_class(masters, **options)` that steps the masters, so the
optimizer's states are in `dtype` too. Its `step()`:

1. gives each master the gradient of its parameter, upcast to `dtype`;
2. steps the optimizer on the masters (updates too small for bf16 accumulate there: at
   lr 1e-4 an AdamW update is ~1e-4 of a weight of order 1, below bf16's relative spacing
   of 2^-8 = 3.9e-3, so a bf16 optimizer would round most of them away);
3. copies every master into its parameter in place (rounding to nearest), so the module's
   own parameter objects, which the compiled program and any hooks hold, stay the same;
4. drops the upcast gradients (they live only during the step).

`zero_grad()` clears the parameters' gradients. Parameters already in `dtype` (or wider:
refused) are stepped directly, without a copy.

On a `ParallelModule`, `module.parameters()` are this rank's pieces and their gradients are
already reduced over the mesh when `loss.backward()` returns, so each rank keeps masters
and states of its pieces only: sharded storage (ZeRO) shards the master copy and the states
too, and replicated pieces step identically on every rank. This is exactly the memory
`autopar.plan(..., optimizer=..., master_weights=torch.float32)` counts per parameter
element (`autopar.costs.optimizer_state`): parameter and gradient in the model's dtype, the master
and the states in `dtype`. The same wrapper around the plain model is the single-process
equivalent (the recipe, roundings included, is identical).

fp16 models need loss scaling against gradient underflow, which this does not do; bf16
(fp32's exponent range) does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from autopar.errors import OptimizerError


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class MasterWeights:
    """A torch-optimizer-like object stepping `dtype` master copies of `params` (see the
    module docstring). Build it with `master_weights`.

    Attributes: `optimizer` (the torch optimizer over the masters: its `param_groups` are
    the ones to change for a learning-rate schedule), `params` (the model's trainable
    parameters, in order), `masters` (each parameter's master: the parameter itself where it
    is already in `dtype`), `dtype`.
    """

    def __init__(self, params: Iterable[nn.Parameter], optimizer_class: type,
                 dtype: torch.dtype, options: dict) -> None:
        self.dtype = dtype
        self.params: tuple[nn.Parameter, ...] = tuple(params)
        # A master is a fresh leaf the optimizer owns; it starts equal to the parameter (the
        # upcast is exact), so the first step starts from the model's own weights.
        self.masters: tuple[torch.Tensor, ...] = tuple(
            p if p.dtype == dtype else nn.Parameter(p.detach().to(dtype), requires_grad=True)
            for p in self.params)
        self.optimizer: torch.optim.Optimizer = optimizer_class(list(self.masters), **options)

    @property
    def param_groups(self) -> list[dict]:
        """The inner optimizer's parameter groups (learning rate and other options)."""
        return self.optimizer.param_groups

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """One optimizer step on the masters from the parameters' current gradients, then
        the parameters set to their masters. `closure` (re-evaluating the loss and calling
        backward) runs first, as torch optimizers run it. Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for param, master in zip(self.params, self.masters):
            if master is not param:
                # None stays None: the optimizer skips a parameter without a gradient.
                master.grad = None if param.grad is None else param.grad.to(self.dtype)
        self.optimizer.step()
        for param, master in zip(self.params, self.masters):
            if master is not param:
                param.copy_(master)
                master.grad = None  # the upcast gradient is transient, not kept memory
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' gradients (to None, or to zeros), as `Optimizer.zero_grad`."""
        for param in self.params:
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                param.grad.detach_().zero_()

    def state_dict(self) -> dict:
        """The inner optimizer's state and the masters (to resume training exactly: the
        parameters alone lack the low bits of the masters)."""
        return {"optimizer": self.optimizer.state_dict(),
                "masters": [master.detach().clone() for master in self.masters]}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict()` returned (from a wrapper over the same parameters);
        the parameters are set to the restored masters."""
        masters = state["masters"]
        if len(masters) != len(self.masters) or any(
                a.shape != b.shape for a, b in zip(masters, self.masters)):
            raise OptimizerError(
                "the master weights do not fit this model's parameters",
                expected=f"{len(self.masters)} masters shaped like this rank's parameters",
                got=f"{len(masters)} masters",
                fix="load the state dict saved by the same rank of the same plan")
        self.optimizer.load_state_dict(state["optimizer"])
        with torch.no_grad():
            for param, master, saved in zip(self.params, self.masters, masters):
                master.copy_(saved)
                param.copy_(master)

    def __repr__(self) -> str:
        copied = sum(m is not p for p, m in zip(self.params, self.masters))
        return (f"MasterWeights({type(self.optimizer).__name__}, {_dtype_name(self.dtype)} "
                f"masters of {copied} of {len(self.params)} parameters)")


def master_weights(module: nn.Module | Iterable[nn.Parameter],
                   optimizer_class: type | None = None,
                   *, dtype: torch.dtype = torch.float32, **options) -> MasterWeights:
    """A `MasterWeights` stepping `optimizer_class(**options)` (default
    `torch.optim.AdamW`) on `dtype` masters of the trainable parameters of `module` (an
    `nn.Module`, such as a `ParallelModule`, or an iterable of parameters). Not collective.

    Raises `OptimizerError` when `optimizer_class` is not a torch optimizer class, `dtype`
    is not a floating dtype, a parameter is not floating-point or is wider than `dtype`,
    or no parameter is narrower than `dtype` (then there is nothing to keep a master of:
    use the optimizer directly; an autocast model keeps its parameters in fp32 already).
    """
    if optimizer_class is None:
        optimizer_class = torch.optim.AdamW
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class,
                                                             torch.optim.Optimizer)):
        raise OptimizerError(
            "master_weights needs a torch optimizer class", expected="e.g. torch.optim.AdamW",
            got=repr(optimizer_class)[:80],
            fix="pass the class and its options: master_weights(pm, torch.optim.AdamW, lr=1e-4)")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise OptimizerError("master weights need a floating-point dtype",
                             expected="e.g. torch.float32", got=repr(dtype),
                             fix="pass dtype=torch.float32")
    params = module.parameters() if isinstance(module, nn.Module) else module
    # parameters() yields a tied parameter once; an iterable might repeat it.
    trainable = tuple({id(p): p for p in params if p.requires_grad}.values())
    if not trainable:
        raise OptimizerError("master_weights got no trainable parameters",
                             expected="a module with parameters that require grad",
                             got=f"{type(module).__name__} with none",
                             fix="pass the compiled model (or its parameters)")
    for param in trainable:
        if not param.dtype.is_floating_point or param.dtype.itemsize > dtype.itemsize:
            raise OptimizerError(
                f"a {_dtype_name(param.dtype)} parameter cannot have a "
                f"{_dtype_name(dtype)} master copy",
                expected=f"floating-point parameters no wider than {_dtype_name(dtype)}",
                got=f"a parameter of shape {tuple(param.shape)}, {_dtype_name(param.dtype)}",
                fix="convert the model to bfloat16 before compiling (model.to(torch.bfloat16))"
                    ", or freeze that parameter")
    if all(p.dtype == dtype for p in trainable):
        raise OptimizerError(
            f"every parameter is already {_dtype_name(dtype)}: there is no narrower copy to "
            "keep a master of",
            expected=f"a model with parameters narrower than {_dtype_name(dtype)} "
                     "(bfloat16 or float16)",
            got=f"{len(trainable)} {_dtype_name(dtype)} parameters",
            fix=f"use {optimizer_class.__name__}(pm.parameters()) directly, or convert the "
                "model with model.to(torch.bfloat16) before compiling")
    return MasterWeights(trainable, optimizer_class, dtype, options)
