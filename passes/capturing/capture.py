"""capture: a model and example inputs -> an ATen-level torch.fx GraphModule.

The model is traced with `torch.export.export(strict=False)` to the training IR, which keeps
high-level ops (aten.linear, aten.layer_norm, aten.scaled_dot_product_attention, ...) and the
model's train/eval behaviour. The only decompositions run are the rules' `DECOMPOSITIONS`
(means as sums over a global count, so that a split batch reduces to summands). Parameters
and example inputs may live on the meta device, so the largest models are captured without
their memory.

Reads `node.meta["nn_module_stack"]` (written by torch.export). Writes on every node:
- `autopar_role`: "parameter", "buffer", "constant" or "input" for placeholders, "op" for
  every computing node, "output" for the output node.
- `autopar_names`: placeholders of parameters, buffers and constants only; every fully
  qualified name of the tensor (tied weights have several), the canonical one first.
- `autopar_module`: dotted path of the innermost module that produced the node, "" at top.

Calling convention of the returned GraphModule: its placeholders are the parameters, buffers
and constants the graph uses, in signature order (a tied tensor appears once; one never used
is dropped), then one per flattened user input (every leaf torch.export made a placeholder
of, tensor or not, used or not). Look a state placeholder up by `autopar_names[0]` in
`model.named_parameters()` / `named_buffers()`, or for constants in
`gm.meta["autopar_constants"]` (canonical name -> tensor). It returns the new values of the
buffers the model mutates (canonical names in `gm.meta["autopar_mutated_buffers"]`, in
order), then the flat tuple of the model's outputs, non-tensor leaves (None) included.
`gm.meta["autopar_call_spec"]` holds torch.export's (in_spec, out_spec) pytree specs of the
user inputs `(args, kwargs)` and of the user outputs.

Outputs: a forward may return the loss alone, or inside a tuple (first), a dict or a
`ModelOutput` (key "loss"). Values torch.export can't return (a transformers cache object,
or anything else that is not a tensor, number, string or registered pytree container) are
dropped from the captured outputs (None in a ModelOutput, the key gone from a dict), and
named in `gm.meta["autopar_dropped_outputs"]`. `gm.meta["autopar_loss"]` is the loss's
index among the flat user outputs, None when no output is a floating-point scalar where
a loss is looked for (`loss_output` raises then).

Training or inference: `capture(..., training=False)` traces the model as it serves, in
eval mode (dropout off, batch norm on its running statistics) with no parameter requiring
a gradient, so every parameter is frozen and nothing lies on a gradient path: the plan has
no backward, no gradients and no optimizer state, and the forward may return any tensors.
The model's modes and flags are restored afterwards. `gm.meta["autopar_training"]` says
which (`is_training`). A forward-only graph writes its buffer updates in place where they
are made (`write_back`: a KV cache's), so it returns the model's outputs alone.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import fx, nn
from torch.export.graph_signature import InputKind, OutputKind

from autopar.errors import CaptureError, LossError
from autopar.passes.capturing.repeat_blocks import capture_repeated
from autopar.passes.capturing.write_back import write_back
from autopar.rules import DECOMPOSITIONS
from autopar.values.specs import FROZEN, MODULE, NAMES, ROLE, SHARDED_OUTPUTS

CONSTANTS = "autopar_constants"
CALL_SPEC = "autopar_call_spec"
MUTATED = "autopar_mutated_buffers"
LOSS = "autopar_loss"
DROPPED = "autopar_dropped_outputs"
TRAINING = "autopar_training"

_ROLES = {
    InputKind.PARAMETER: "parameter",
    InputKind.BUFFER: "buffer",
    InputKind.CONSTANT_TENSOR: "constant",
    InputKind.USER_INPUT: "input",
}
_STATE_ROLES = ("parameter", "buffer", "constant")


def capture(model: nn.Module, example_inputs: tuple, *,
            dynamic_shapes: Any = None, repeat_blocks: bool = True,
            training: bool = True) -> fx.GraphModule:
    """Trace `model(*example_inputs)` into a GraphModule with autopar meta on every node.

    `dynamic_shapes` is passed to torch.export as is (e.g. `({0: Dim("batch")}, ...)`).
    With `repeat_blocks`, a model whose main ModuleList holds many identical blocks is
    traced with four of them and the others stamped, the same graph in a fraction of the
    time (`passes/capturing/repeat_blocks.py`; not with `dynamic_shapes`). With
    `training=False`, the forward as it serves (module docstring).
    Raises `CaptureError` when torch.export cannot trace the model.
    """
    if not isinstance(example_inputs, tuple):
        raise CaptureError(
            "example_inputs must be the positional arguments of model.forward",
            expected="a tuple", got=type(example_inputs).__name__,
            fix="wrap them in a tuple, e.g. (x,)")
    trace = _trace if training else _serving_trace
    with nullcontext() if training else _serving(model):
        gm = None
        if repeat_blocks and dynamic_shapes is None:
            gm = capture_repeated(model, example_inputs, trace, mutated=MUTATED)
        if gm is None:
            gm = trace(model, example_inputs, dynamic_shapes)
    gm.meta[TRAINING] = training
    return gm


def _serving_trace(model: nn.Module, example_inputs: tuple,
                   dynamic_shapes: Any = None) -> fx.GraphModule:
    """`_trace`, with the buffer updates written in place (`write_back`)."""
    return write_back(_trace(model, example_inputs, dynamic_shapes), MUTATED)


def is_training(gm: fx.GraphModule) -> bool:
    """Whether `gm` was captured for training (`capture`'s `training`)."""
    return gm.meta.get(TRAINING, True)


def leave_outputs_sharded(gm: fx.GraphModule) -> fx.GraphModule:
    """Mark `gm`'s outputs as the caller takes them: split as the plan leaves them, not
    gathered whole (`SHARDED_OUTPUTS` on the output node, which copies of it keep)."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    output.meta[SHARDED_OUTPUTS] = True
    return gm


def outputs_sharded(gm: fx.GraphModule) -> bool:
    """Whether `gm`'s outputs may stay split (`leave_outputs_sharded`)."""
    return any(n.op == "output" and n.meta.get(SHARDED_OUTPUTS) for n in gm.graph.nodes)


@contextmanager
def _serving(model: nn.Module) -> Iterator[None]:
    """`model` in eval mode with no parameter requiring a gradient; as it was after."""
    modes = [(module, module.training) for module in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    for parameter, _ in flags:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode
        for parameter, flag in flags:
            parameter.requires_grad_(flag)


def _trace(model: nn.Module, example_inputs: tuple,
           dynamic_shapes: Any = None) -> fx.GraphModule:
    """`capture` of the whole model by torch.export."""
    dropped: list[str] = []
    try:
        with _without_stack_traces(), _exportable_outputs(model, dropped):
            program = torch.export.export(model, _distinct(example_inputs),
                                          dynamic_shapes=dynamic_shapes, strict=False)
            # Means become sums over a global count, so a split batch reduces to summands.
            with warnings.catch_warnings():  # torch's own deprecation noise from re-tracing
                warnings.simplefilter("ignore", FutureWarning)
                program = program.run_decompositions(DECOMPOSITIONS)
    except Exception as error:  # any tracing failure is the user's model, reported as one
        raise _capture_error(model, error) from error

    gm = program.graph_module
    roles = {spec.arg.name: (_ROLES.get(spec.kind), spec.target)
             for spec in program.graph_signature.input_specs}
    state = _state_names(model, program)
    constants: dict[str, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            role, target = roles[node.name]
            assert role is not None, f"unexpected input kind for {node.name}"
            node.meta[ROLE] = role
            if role in _STATE_ROLES:
                node.meta[NAMES] = state[role][target]
                if role == "constant":
                    constants[node.meta[NAMES][0]] = program.constants[target]
                if role == "parameter":
                    node.meta[FROZEN] = not model.get_parameter(target).requires_grad
        else:
            node.meta[ROLE] = "output" if node.op == "output" else "op"
        node.meta[MODULE] = _module_path(node)
    _merge_aliases(gm.graph)
    gm.graph.lint()
    gm.recompile()
    gm.meta[CONSTANTS] = constants
    gm.meta[CALL_SPEC] = (program.call_spec.in_spec, program.call_spec.out_spec)
    gm.meta[DROPPED] = tuple(dict.fromkeys(dropped))
    gm.meta[MUTATED] = tuple(state["buffer"][spec.target][0]
                             for spec in program.graph_signature.output_specs
                             if spec.kind == OutputKind.BUFFER_MUTATION)
    gm.meta[LOSS] = _loss_index(gm)
    return gm


def loss_output(gm: fx.GraphModule) -> int:
    """The index of the loss among `gm`'s flat user outputs; `LossError` when the forward
    returns none (see the module docstring for where a loss is looked for)."""
    index = gm.meta[LOSS]
    if index is None:
        _, out_spec = gm.meta[CALL_SPEC]
        raise LossError(
            "the model's forward must return its training loss",
            expected="a floating-point scalar tensor: returned alone, first in a tuple, or "
                     "under the key 'loss' of a dict or ModelOutput",
            got=f"outputs {_describe_outputs(gm, out_spec)}",
            fix="compute the loss inside forward (e.g. pass the labels and return "
                "F.cross_entropy(logits, labels)), or wrap the model in a module that does; "
                "to serve the model instead, plan or compile it with training=False")
    return index


def _user_output_specs(gm: fx.GraphModule) -> list[object]:
    """Each flat user output: its traced (fake) tensor, or the constant returned."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = list(output.args[0])[len(gm.meta[MUTATED]):]
    return [v.meta.get("val") if isinstance(v, fx.Node) else v for v in values]


def _loss_index(gm: fx.GraphModule) -> int | None:
    _, out_spec = gm.meta[CALL_SPEC]
    count = out_spec.num_leaves
    structure = torch.utils._pytree.tree_unflatten(list(range(count)), out_spec)
    if isinstance(structure, int):
        index = structure
    elif isinstance(structure, Mapping):
        index = structure.get("loss")
    elif isinstance(structure, (tuple, list)) and structure:
        index = structure[0]
    else:
        index = None
    if not isinstance(index, int):
        return None
    value = _user_output_specs(gm)[index]
    scalar = (isinstance(value, torch.Tensor) and value.dim() == 0
              and value.dtype.is_floating_point)
    return index if scalar else None


def _describe_outputs(gm: fx.GraphModule, out_spec: object) -> str:
    def describe(value: object) -> str:
        if isinstance(value, torch.Tensor):
            return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
        return type(value).__name__ if value is not None else "None"

    shown = [describe(v) for v in _user_output_specs(gm)]
    return str(torch.utils._pytree.tree_unflatten(shown, out_spec)).replace("'", "")


@contextmanager
def _exportable_outputs(model: nn.Module, dropped: list[str]) -> Iterator[None]:
    """`model.forward` for the trace, with the output values torch.export can't return
    replaced (see the module docstring); their paths are appended to `dropped`. The
    instance attribute is removed afterwards, so the model is left as it was."""
    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return _returnable(original(*args, **kwargs), "output", dropped)

    model.forward = forward
    try:
        yield
    finally:
        del model.forward


_PLAIN = (torch.Tensor, int, float, bool, str, type(None))


def _returnable(value: Any, path: str, dropped: list[str]) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, Mapping):
        kept = {key: _returnable(item, f"{path}[{key!r}]", dropped)
                for key, item in value.items()}
        if type(value) is dict:
            return {key: item for key, item in kept.items() if item is not None
                    or value[key] is None}
        return type(value)(**kept)  # a ModelOutput: a None field is left out of its leaves
    if type(value) in (tuple, list):
        return type(value)(_returnable(item, f"{path}[{i}]", dropped)
                           for i, item in enumerate(value))
    if type(value) in torch.utils._pytree.SUPPORTED_NODES:
        return value
    dropped.append(f"{path} ({type(value).__name__})")
    return None


def _distinct(example_inputs: tuple) -> tuple:
    """The inputs with a repeated tensor object replaced by a copy of it.

    One placeholder per input position, whatever tracing makes of aliased inputs, keeps the
    calling convention the same as the model's.
    """
    seen: set[int] = set()

    def fresh(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if id(value) in seen:
            return value.clone()
        seen.add(id(value))
        return value

    return torch.utils._pytree.tree_map(fresh, example_inputs)


@contextmanager
def _without_stack_traces() -> Iterator[None]:
    # Recording a Python stack per node is about a quarter of export time on large models;
    # autopar_module already says where a node comes from.
    config = torch.fx.config
    if not hasattr(config, "do_not_emit_stack_traces"):  # older torch: always records
        yield
        return
    saved = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = saved


def _state_names(model: nn.Module, program: torch.export.ExportedProgram,
                 ) -> dict[str, dict[str, tuple[str, ...]]]:
    """For each state role, export target -> every name of that tensor, canonical first."""
    by_role = {
        "parameter": model.named_parameters(remove_duplicate=False),
        "buffer": model.named_buffers(remove_duplicate=False),
        # torch.export lists an aliased constant under each of its names.
        "constant": program.constants.items(),
    }
    result = {}
    for role, named in by_role.items():
        aliases: dict[int, list[str]] = {}
        tensor_of: dict[str, Any] = {}
        for name, tensor in named:
            aliases.setdefault(id(tensor), []).append(name)
            tensor_of[name] = tensor
        result[role] = {name: tuple(aliases[id(t)]) for name, t in tensor_of.items()}
    return result


def _merge_aliases(graph: fx.Graph) -> None:
    """Keep one placeholder per state tensor and drop state placeholders nothing uses.

    torch.export gives each name of a tied weight its own placeholder but routes every use
    through one of them; user inputs always stay so the calling convention is predictable.
    """
    first: dict[tuple[str, ...], fx.Node] = {}
    for node in list(graph.nodes):
        if node.op != "placeholder" or node.meta[ROLE] not in _STATE_ROLES:
            continue
        kept = first.get(node.meta[NAMES])
        if kept is None and node.users:
            first[node.meta[NAMES]] = node
        elif kept is not None:
            node.replace_all_uses_with(kept)
    for node in list(graph.nodes):
        if node.op == "placeholder" and node.meta[ROLE] in _STATE_ROLES and not node.users:
            graph.erase_node(node)


def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path, _ = next(reversed(stack.values()))
    # A module called twice is recorded as "name@1"; the module itself is what matters.
    return re.sub(r"@\d+$", "", path)


def _capture_error(model: nn.Module, error: Exception) -> CaptureError:
    message = str(error).strip()
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    # The first line says what failed; "- " lines right after it say which guard or value.
    details = list(dict.fromkeys(line for line in lines[1:4] if line.startswith("- ")))
    got = f"{type(error).__name__}: {' '.join(lines[:1] + details)[:400] or '(no message)'}"
    where = re.search(r"The following call raised this error:\s*\n\s*(File [^\n]+)", message)
    if where:
        got += f" ({where.group(1)})"
    fix = _fix_hint(error, message)
    suggested = re.search(r"Suggested fixes:\s*\n(.*?)(?:\n\s*\n|$)", message, re.S)
    if suggested:
        fix += f"; torch suggests: {' '.join(suggested.group(1).split())}"
    return CaptureError(
        f"torch.export could not capture {type(model).__name__}",
        expected="a forward that torch.export can trace (non-strict)", got=got, fix=fix)


def _fix_hint(error: Exception, message: str) -> str:
    lowered = message.lower()
    if re.search(r"specialized it to be a constant \([01]\)", message):
        return ("torch.export treats sizes 0 and 1 as constants: give the example input at "
                "least 2 along every dimension declared dynamic")
    if "data-dependent" in lowered or "data dependent" in lowered:
        return ("make the control flow and the sizes independent of tensor values: branch "
                "on shapes or config (or use torch.cond), and replace boolean-mask "
                "indexing such as x[mask] or nonzero() by fixed-size ops (torch.where, "
                "masked_fill, a weighted sum with the mask)")
    if "constraint" in lowered or "specializ" in lowered or "dynamic_shapes" in lowered:
        return ("a dimension declared dynamic is fixed or bounded by the model; give its Dim "
                "those bounds, drop it from dynamic_shapes, or use Dim.AUTO to let export decide")
    if isinstance(error, (TypeError, ValueError, RuntimeError, AssertionError)):
        return ("check that model(*example_inputs) runs eagerly with these inputs; if it "
                "does, rewrite the Python that export rejects (see the message)")
    return "rewrite the Python that torch.export rejects (see the message)"
