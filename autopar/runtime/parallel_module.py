"""`ParallelModule`: one rank's compiled model, an `nn.Module` that trains with plain torch.

It holds this rank's pieces of the model's parameters and buffers, registered under the
model's own names (`pm.named_parameters()` reads like `model.named_parameters()`, with local
shapes), and runs the rank program of `autopar.passes.lowering.lower` on them. `pm(*inputs)` takes
the global inputs, the same on every rank, and returns global outputs; `loss.backward()`
leaves on every local parameter the gradient of its piece, already reduced over the mesh, so
any torch optimizer steps the pieces as if they were the whole model.

A forward-only plan (`autopar.compile(..., training=False)`) runs each call without
autograd, in the model's eval mode as it was captured, and returns the outputs whole.

A plan of several micro-batches runs each call as that many forwards and backwards of
one micro-batch (`autopar.runtime.microbatches`); the call returns the batch's loss and its
backward hands over the accumulated gradients.

Inputs must have the structure, shapes and dtypes of the example inputs the model was
compiled for, else `InputMismatchError`. It does not recompile by itself: compiling is
collective (every rank must do it together), so a silent recompile on a rank that saw other
shapes would hang the others. Compile again, on every rank, for new shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch import fx, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.utils import _pytree as pytree

from autopar.errors import InputMismatchError
from autopar.runtime.collectives import RankContext
from autopar.runtime.counter import CommCounter
from autopar.runtime.microbatches import run_microbatches
from autopar.runtime.powersgd import LowRankReducer
from autopar.runtime.program import RankProgram, StateSlot
from autopar.runtime.redistribution import Redistribution
from autopar.runtime.shards import gather_full, local_piece
from autopar.values.microbatch import BatchSplit, micro_inputs
from autopar.values.placement import format_placements, parse_placements
from autopar.values.plan import Plan
from autopar.values.specs import TensorSpec


def _whole_batch(spec, split: BatchSplit | None, cut: bool):
    """The user input `spec` of one micro-batch as the call takes it: the whole batch."""
    if split is None or not cut:
        return spec
    return TensorSpec((spec.shape[0] * split.microbatches, *spec.shape[1:]), spec.dtype)


def owner_of(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module that holds `name` under `root`, creating empty modules on the way."""
    *path, leaf = name.split(".")
    module = root
    for part in path:
        child = module._modules.get(part)
        if child is None:
            child = nn.Module()
            module.add_module(part, child)
        module = child
    return module, leaf


def describe_value(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {tuple(value.shape)}, {value.dtype}"
    if isinstance(value, TensorSpec):
        return f"tensor of shape {value.shape}, {value.dtype}"
    return repr(value)


def register_pieces(module: nn.Module, slots: tuple[StateSlot, ...],
                    pieces: dict[str, torch.Tensor], persistent: set[str]
                    ) -> dict[str, torch.Tensor]:
    """Register each slot's piece on `module` under every name of the slot (parameters as
    Parameters, buffers persistent when `persistent` names them; tied names share the
    piece); return the constants, which are not registered, by name."""
    constants: dict[str, torch.Tensor] = {}
    for slot in slots:
        piece = pieces[slot.names[0]]
        if slot.role == "parameter":
            piece = nn.Parameter(piece, requires_grad=slot.requires_grad)
        for name in slot.names:
            if slot.role == "constant":
                constants[name] = piece
                continue
            owner, leaf = owner_of(module, name)
            if slot.role == "parameter":
                owner.register_parameter(leaf, piece)
            else:
                owner.register_buffer(leaf, piece, persistent=name in persistent)
    return constants


def adopt_pieces(module: nn.Module, slots: tuple[StateSlot, ...],
                 value: Callable[[StateSlot], torch.Tensor],
                 tensors: dict[str, torch.Tensor]) -> None:
    """Make each given tensor (by canonical name) hold its slot's piece on `module`
    (`tensor.data = piece`) and register it under every name of the slot (see
    `ParallelModule.adopt`); slots without a given tensor keep their own."""
    for slot in slots:
        original = tensors.get(slot.names[0])
        if slot.role == "constant" or original is None:
            continue
        original.data = value(slot).data
        for name in slot.names:
            owner, leaf = owner_of(module, name)
            table = owner._parameters if slot.role == "parameter" else owner._buffers
            table[leaf] = original


def flatten_inputs(args: tuple, kwargs: dict, in_spec) -> list:
    """The call's flat input leaves; `InputMismatchError` when they are structured
    otherwise than the example inputs (`in_spec`, export's pytree spec)."""
    flat, spec = pytree.tree_flatten((args, kwargs))
    if spec != in_spec:
        raise InputMismatchError(
            "the inputs are structured differently from the example inputs",
            expected=str(in_spec), got=str(spec),
            fix="call the model with the arguments it was compiled with")
    return flat


def check_inputs(flat: list, examples: tuple) -> None:
    """`InputMismatchError` naming the first flat input whose shape, dtype or value is not
    its example's (a `TensorSpec`, or the value a non-tensor leaf was specialised to)."""
    for i, (value, example) in enumerate(zip(flat, examples)):
        same = (isinstance(value, torch.Tensor) and tuple(value.shape) == example.shape
                and value.dtype == example.dtype) if isinstance(example, TensorSpec) \
            else not isinstance(value, torch.Tensor) and value == example
        if not same:
            raise InputMismatchError(
                f"input {i} differs from the example input the model was compiled for",
                expected=describe_value(example), got=describe_value(value),
                fix="compile again (on every rank) with example inputs of these shapes, "
                    "or pad the inputs to the compiled shapes")


class ParallelModule(nn.Module):
    """This rank's part of a model compiled for a mesh (see the module docstring).

    Build it with `autopar.compile`. Attributes: `plan` (the `Plan`), `counter` (the
    `CommCounter` of the collectives run so far), `code` (the rank program as Python).
    `full_state_dict()` and `full_grads()` are collective: every rank calls them together.
    """

    def __init__(self, program: RankProgram, plan: Plan, *, slots: tuple[StateSlot, ...],
                 pieces: dict[str, torch.Tensor], persistent: set[str],
                 context: RankContext | None, coordinate: tuple[int, ...], call_spec: tuple,
                 mutated: tuple[str, ...], split: BatchSplit | None = None,
                 weights: Callable[[list[list]], list[float]] | None = None) -> None:
        """`slots` starts with `program.state`; `pieces` holds this rank's piece of each
        slot by canonical name; `persistent` names the buffers the state dict keeps.
        With micro-batches, `program` is one micro-batch's, `split` says how calls are cut
        and `weights` gives the micro-batches' loss weights from their inputs."""
        super().__init__()
        self.plan, self.coordinate = plan, tuple(coordinate)
        self._split, self._weights = split, weights
        self._context = context
        self._inputs = tuple(_whole_batch(spec, split, cut) for spec, cut in zip(
            program.inputs, split.split if split else (False,) * len(program.inputs)))
        self._in_spec, self._out_spec = call_spec
        # Calls with as many positional leaves as the example (the usual `pm(x, y)`) skip the
        # tree walk: forward's own cost is paid on every step (benchmarks/overhead.py).
        arity = len(program.inputs)
        positional = pytree.tree_flatten((tuple(range(arity)), {}))[1]
        self._positional_arity = arity if self._in_spec == positional else None
        self._program: fx.GraphModule = program.module
        self._collectives = program.collectives
        self._output_specs = program.outputs
        self._slots = slots
        self._constants = register_pieces(self, slots, pieces, persistent)
        self._arguments = slots[:len(program.state)]
        self._mutated = tuple(next(s for s in slots if name in s.names) for name in mutated)
        # Where each slot's tensor lives, resolved once: forward reads them on every call.
        self._homes = {slot.names[0]: owner_of(self, slot.names[0]) for slot in slots
                       if slot.role != "constant"}
        # The saved-tensor scopes hook every tensor autograd saves: enter one only when
        # needed. The recompute scope also regathers (only the innermost hooks are active).
        regathers = context is not None and any(
            r.regather and any(s.kind == "all_gather" for s in r.forward_steps)
            for _, r in program.collectives)
        self._scope = program.recompute if program.recompute is not None else \
            context.regather if regathers else None

    @property
    def inputs(self) -> tuple:
        """The flat inputs a call takes, as compiled: a `TensorSpec` (the whole batch's shape
        and dtype) per tensor, the value itself otherwise."""
        return self._inputs

    @property
    def slots(self) -> tuple[StateSlot, ...]:
        """Every state tensor the program reads: its names, role and placements."""
        return self._slots

    def adopt(self, tensors: dict[str, torch.Tensor]) -> None:
        """Hold this rank's pieces in the given tensors (by canonical name) instead of its
        own: each becomes the piece (`tensor.data = piece`) and is registered under every
        name of its slot. Tensors an optimizer already holds then step the pieces. Not
        collective."""
        adopt_pieces(self, self._slots, self.value, tensors)

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The DeviceMesh the slots' placements are on (None on one device)."""
        return self._context.mesh if self._context is not None else None

    @property
    def counter(self) -> CommCounter:
        """Bytes and calls of every collective the program ran (forward and backward)."""
        return self._context.counter if self._context is not None else CommCounter()

    @property
    def low_rank(self) -> LowRankReducer | None:
        """The PowerSGD state of its compressed gradients (`autopar.runtime.powersgd`);
        None on one device."""
        return self._context.reducer.low_rank if self._context is not None else None

    @property
    def collectives(self) -> tuple[tuple[str, Redistribution], ...]:
        """Each inserted collective submodule's name and the edge conversion it performs."""
        return self._collectives

    @property
    def code(self) -> str:
        """This rank's program as Python, with each inserted collective explained."""
        mesh = self.plan.mesh
        lines = [f"# {self.plan.model} on mesh {mesh.describe()}, rank at {self.coordinate}"]
        for name, redistribution in self._collectives:
            moves = [f"{s.kind}({mesh.axis_names[s.axis]})"
                     for s in redistribution.forward_steps if s.kind]
            back = [f"{s.kind}({mesh.axis_names[s.axis]})"
                    for s in redistribution.backward_steps if s.kind]
            lines.append(
                f"# self.{name}: {format_placements(redistribution.src)} -> "
                f"{format_placements(redistribution.dst)}; forward {', '.join(moves) or '-'}"
                f"; backward {', '.join(back) or '-'}")
        return "\n".join(lines) + "\n" + self._program.code

    def value(self, slot: StateSlot) -> torch.Tensor:
        """This rank's tensor of `slot` (its piece; a constant as held)."""
        if slot.role == "constant":
            return self._constants[slot.names[0]]
        owner, leaf = self._homes[slot.names[0]]
        return getattr(owner, leaf)

    def _flat_inputs(self, args: tuple, kwargs: dict) -> list:
        if kwargs or len(args) != self._positional_arity:
            flat = flatten_inputs(args, kwargs, self._in_spec)
        else:
            flat = list(args)  # as many as the example's leaves; each is checked below
        check_inputs(flat, self._inputs)
        return flat

    def forward(self, *args, **kwargs):
        flat = self._flat_inputs(args, kwargs)
        if self._split is None:
            return self._run(flat)
        inputs = micro_inputs(flat, self._split)
        leaves: list = []

        def loss_of(micro: list) -> torch.Tensor:
            # The program returns the loss and Nones (split_microbatches checked it).
            leaves[:] = self._run_flat(micro)
            return next(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))

        loss = run_microbatches(loss_of, inputs, self._weights(inputs),
                                [p for p in self.parameters() if p.requires_grad],
                                self._context.reducer if self._context is not None else None)
        leaves = [loss if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        return leaves[0] if self._out_spec.is_leaf() else \
            pytree.tree_unflatten(leaves, self._out_spec)

    def _run(self, flat: list):
        """The program on flat user inputs, outputs as the model returns them (DTensors,
        for a plan that leaves them split: `_as_dtensors`)."""
        outputs = self._run_flat(flat)
        if self.plan.outputs == "sharded" and self.device_mesh is not None:
            outputs = self._as_dtensors(outputs)
        if self._out_spec.is_leaf():
            return outputs[0]
        return pytree.tree_unflatten(outputs, self._out_spec)

    def _run_flat(self, flat: list) -> list:
        """The program on flat user inputs: its flat outputs, mutated buffers written."""
        if self._context is not None:
            self._context.prefetch.begin()
        values = [self.value(slot) for slot in self._arguments]
        # A forward-only plan records nothing for a backward it does not have.
        with self._scope if self._scope is not None else nullcontext(), \
                nullcontext() if self.plan.training else torch.no_grad():
            outputs = self._program(*values, *flat)
        # A mutated buffer (batch norm's running statistics) takes its new value as a new
        # tensor, not in place: the backward may still read the old one (an op recomputed
        # from it), whose version must not change.
        for slot, new in zip(self._mutated, outputs):
            piece = local_piece(new, slot.placements, self.plan.mesh.shape, self.coordinate)
            for name in slot.names:
                owner, leaf = owner_of(self, name)
                owner._buffers[leaf] = piece
        return list(outputs[len(self._mutated):])

    def _as_dtensors(self, outputs: list) -> list:
        """Each tensor output as the DTensor its piece is of, placed as the plan's output
        node reads it, of the shape the captured graph gives it."""
        output = next(n for n in self.plan.nodes if n.role == "output")
        placed = iter(output.inputs[len(self._mutated):])
        specs = iter(self._output_specs[len(self._mutated):])
        wrapped = []
        for value in outputs:
            spec = next(specs)
            if isinstance(value, torch.Tensor):
                placements = parse_placements(next(placed))
                shape = tuple(spec.shape)
                value = DTensor.from_local(value, self.device_mesh, placements, run_check=False,
                                           shape=torch.Size(shape),
                                           stride=torch.empty(shape, device="meta").stride())
            wrapped.append(value)
        return wrapped

    def _gather(self, piece: torch.Tensor, slot: StateSlot) -> torch.Tensor:
        mesh = self._context.mesh if self._context is not None else None
        return gather_full(piece, slot.placements, slot.shape, mesh, self.plan.mesh.shares)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full parameters and persistent buffers under every name the model's
        `state_dict()` uses (tied names included): loads into the original model. A
        tensor the program never reads was never split: it is returned as held."""
        wanted = self.state_dict(keep_vars=True)
        full = {}
        for slot in self._slots:
            if slot.role == "constant" or not any(n in wanted for n in slot.names):
                continue
            value = self._gather(self.value(slot), slot)
            full.update({name: value for name in slot.names if name in wanted})
        return {name: full[name] if name in full else held.detach()
                for name, held in wanted.items()}

    def full_grads(self) -> dict[str, torch.Tensor | None]:
        """Full gradient of every parameter (None where it has none), under every name of
        `model.named_parameters(remove_duplicate=False)` (a tied weight under each of its
        names). Collective."""
        grads = {}
        for slot in self._slots:
            if slot.role != "parameter":
                continue
            grad = self.value(slot).grad
            full = None if grad is None else self._gather(grad, slot)
            grads.update({name: full for name in slot.names})
        return {name: grads.get(name) for name, _ in
                self.named_parameters(remove_duplicate=False)}
