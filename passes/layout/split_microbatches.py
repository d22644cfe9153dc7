"""Micro-batch pass: whether one training step may run as micro-batches, and how their
losses combine into the batch's.

Running the batch as M micro-batches one after the other, each forward followed by its
backward (gradient accumulation), keeps the activations of one micro-batch at a time. It
gives the whole batch's loss and gradients exactly when the loss is a sum over the samples,
`num`, divided by a count that is itself a sum over the samples or a constant, `den`:

    loss = sum_i num_i / sum_i den_i = sum_i w_i * loss_i,   w_i = den_i / sum_j den_j,

and, `den` depending on the inputs only, the gradient is the same weighted sum of the
micro-batches' gradients. A mean loss has `den` the number of samples (constant per
micro-batch: w_i = 1/M), a summed one no `den` (w_i = 1), a cross-entropy with ignored
targets `den` the targets not ignored (w_i from the targets, known before any micro-batch
runs).

Whether `num` and `den` are sums over the samples is what the sharding rules already say of
a batch split: on a virtual axis of M, with the inputs split along dim 0 and the state
replicated, every op between them and the loss must have a strategy that needs no
collective in the forward, nor in the backward except all-reduces of gradients (which
accumulation does: a replicated value is computed the same in every micro-batch, and its
backward is linear in the gradient), and `num` and `den` must come out `P`. An op that mixes samples
(batch normalization's statistics, a loss over the batch's pairs) has none, and the step
is not split. Neither is one that mutates buffers (running statistics would be updated per
micro-batch).

A pipeline needs micro-batches whatever the model. Asked to (`mixing=ACCUMULATE`, what a
forced pipeline does), a step whose ops or loss mix the samples still runs as micro-batches,
as gradient accumulation does in Megatron-LM or DeepSpeed: each micro-batch is the model's
batch for the ops that mix samples (MoE routing gives each micro-batch its own capacity, a
loss over the batch's means takes the micro-batch's), and the step's loss and gradients are
the mean of the micro-batches' (ACCUMULATED, w_i = 1/M), not the whole batch's. Mutated
buffers are refused even then.

A forward-only graph (`is_training` False) has no loss: it splits where it writes no buffer
(a KV cache is the whole batch's) and every output is made sample by sample, along dim 0,
each micro-batch's rows concatenated back (`_forward_split`), and never accumulates.

Reads `autopar_role`, `autopar_tensor`, `autopar_module`; writes nothing.
`split_microbatches(gm, M)` returns the `BatchSplit` or raises `MicrobatchError` saying which op
or output prevents it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.fx as fx

from autopar.costs import formulas, uneven
from autopar.errors import MicrobatchError
from autopar.passes.capturing.capture import MUTATED, is_training
from autopar.passes.capturing.gradient_path import gradient_path
from autopar.passes.capturing.write_back import written_buffers
from autopar.passes.problem.build_problem import edge_ref
from autopar.passes.strategies.find_strategies import find_strategies, is_decision
from autopar.values.graph_module import graph_module
from autopar.values.mesh import Mesh
from autopar.values.microbatch import (
    ACCUMULATE,
    ACCUMULATED,
    COUNTED,
    REFUSE,
    SCALED,
    SUMMED,
    BatchSplit,
)
from autopar.values.placement import Partial, Placements, Replicate, Shard, format_placements
from autopar.values.specs import MODULE, ROLE, TENSOR, TensorSpec

aten = torch.ops.aten

def _user_inputs(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder" and n.meta.get(ROLE) == "input"]


def batch_size(gm: fx.GraphModule) -> int | None:
    """The samples of a step: dim 0 of the first tensor user input (None without one)."""
    for node in _user_inputs(gm):
        spec = node.meta.get(TENSOR)
        if isinstance(spec, TensorSpec) and spec.ndim > 0 and isinstance(spec.shape[0], int):
            return spec.shape[0]
    return None


def _loss(gm: fx.GraphModule) -> fx.Node:
    """The one scalar the graph returns (else `MicrobatchError`)."""
    if gm.meta.get(MUTATED):
        raise MicrobatchError(
            "the model updates buffers in its forward "
            f"({', '.join(gm.meta[MUTATED])}): each micro-batch would update them with its "
            "own statistics", expected="a forward that mutates no buffer",
            got=f"{len(gm.meta[MUTATED])} mutated buffers",
            fix="plan with microbatches=1, or put such layers in eval mode")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = [r for r in output.args[0] if r is not None]
    loss = results[0] if len(results) == 1 and isinstance(results[0], fx.Node) else None
    spec = loss.meta.get(TENSOR) if loss is not None else None
    if not (isinstance(spec, TensorSpec) and spec.numel == 1):
        raise MicrobatchError(
            "micro-batches need a forward that returns the loss alone",
            expected="one scalar tensor", got=f"{len(results)} outputs",
            fix="return the training loss from forward, or plan with microbatches=1")
    return loss


def _numerator_and_count(loss: fx.Node) -> tuple[fx.Node, fx.Node | float | None]:
    """`loss` as `num / den` (den a node or a number), or `(loss, None)` for a sum."""
    if loss.target in (aten.div.Tensor, aten.div.Scalar) and isinstance(loss.args[0], fx.Node):
        return loss.args[0], loss.args[1]
    return loss, None


def _propagate(gm: fx.GraphModule, wanted: list[fx.Node], microbatches: int,
               batch: int) -> dict[str, Placements]:
    """Placements on a virtual axis of `microbatches` of `wanted` and their ancestors, the
    inputs cut along dim 0, such that no edge needs a collective other than a gradient's
    all-reduce; `MicrobatchError` naming the first op that has no such strategy."""
    needed = set().union(*map(_ancestors, wanted))
    mesh = Mesh((microbatches,), ("microbatch",))
    with warnings.catch_warnings():  # ops without a rule: the planner says so itself
        warnings.simplefilter("ignore")
        table = find_strategies(gm, mesh)
    by_name = {n.name: n for n in gm.graph.nodes}
    on_path = gradient_path(gm)
    placed: dict[str, Placements] = {}
    for node in gm.graph.nodes:
        if node not in needed or not is_decision(node):
            continue
        spec = node.meta.get(TENSOR)
        if node.op == "placeholder":
            cut = (node.meta.get(ROLE) == "input" and isinstance(spec, TensorSpec)
                   and spec.ndim > 0 and spec.shape[0] == batch)
            placed[node.name] = (Shard(0),) if cut else (Replicate(),)
            continue
        inputs = table.inputs[node.name]
        have = [placed[producer] for producer, _ in inputs]
        refs = [edge_ref(by_name, on_path, inputs, node.name, k) for k in range(len(inputs))]
        exact = [s for s in table.strategies[node.name] if list(s.inputs) == have]
        choice = next((s for s in exact + list(table.strategies[node.name])
                       if _accumulates(refs, have, s, mesh.shape)), None)
        if choice is None:
            module = node.meta.get(MODULE)
            raise _Mixing(
                f"{node.target} ({node.name}{f', in {module}' if module else ''})",
                f"{node.target} ({node.name}) mixes the samples of the batch: the step "
                "cannot run as micro-batches that give the batch's gradients",
                expected="ops that compute each sample's terms on their own up to the loss",
                got=f"{node.target} with inputs "
                    f"{', '.join(format_placements(p) for p in have)} on a batch split",
                fix="plan with microbatches=1")
        placed[node.name] = choice.output
    return placed


def _accumulates(refs, have: list[Placements], strategy, mesh_shape: tuple[int, ...]) -> bool:
    """Whether reading inputs placed `have` under `strategy` needs no collective but
    gradient all-reduces, which accumulation does: the replicated producer's backward is
    linear in the gradient, and computes the same in every micro-batch."""
    for k, ref in enumerate(refs):
        transfers = formulas.edge_transfers(uneven.tensor_bytes(ref.tensor, mesh_shape),
                                            have[k], strategy.inputs[k],
                                            strategy.output, mesh_shape,
                                            requires_grad=ref.requires_grad, regather=False,
                                            recompute=False)
        if transfers is None or not all(t.backward and t.kind == "all_reduce"
                                        for t in transfers):
            return False
    return True


def split_microbatches(gm: fx.GraphModule, microbatches: int, *, mixing: str = REFUSE
                ) -> BatchSplit:
    """How `gm`'s step runs as `microbatches` micro-batches (see the module docstring).

    A step whose ops or loss mix the samples raises `MicrobatchError` naming the op with
    `mixing=REFUSE` (the default); with `mixing=ACCUMULATE` it gives the ACCUMULATED split
    instead, every input with the batch's dim 0 cut, and `mixes` naming the op. A count that
    does not divide the batch, a forward that returns more than the loss or mutates buffers
    raise `MicrobatchError` in both modes."""
    if mixing not in (REFUSE, ACCUMULATE):
        raise MicrobatchError("unknown way of treating a step that mixes samples",
                              expected=f"{REFUSE!r} or {ACCUMULATE!r}", got=repr(mixing),
                              fix=f"split_microbatches(gm, m, mixing={ACCUMULATE!r})")
    batch = batch_size(gm)
    if batch is None or microbatches < 1 or batch % microbatches:
        raise MicrobatchError(
            f"{microbatches} micro-batches do not divide the batch",
            expected="a count of micro-batches that divides dim 0 of the inputs",
            got=f"{microbatches} for a batch of {batch}",
            fix="pick a divisor of the batch size")
    if not is_training(gm):
        return _forward_split(gm, microbatches, batch)
    loss = _loss(gm)  # buffers mutated or no scalar loss: refused in both modes
    try:
        return _exact_split(gm, microbatches, batch, loss)
    except _Mixing as error:
        if mixing == REFUSE:
            raise
        split = tuple(_has_batch_dim(n, batch) for n in _user_inputs(gm))
        return BatchSplit(microbatches, batch, split, ACCUMULATED, mixes=error.mixes)


def _exact_split(gm: fx.GraphModule, microbatches: int, batch: int,
                 loss: fx.Node) -> BatchSplit:
    """The split whose micro-batches give the batch's loss and gradients exactly, or
    `_Mixing` naming what mixes the samples."""
    numerator, count = _numerator_and_count(loss)
    wanted = [numerator] + ([count] if isinstance(count, fx.Node) else [])
    placed = _propagate(gm, wanted, microbatches, batch)
    partial = (Partial(),)
    if placed[numerator.name] != partial:
        raise _Mixing(
            f"the loss ({numerator.name}, not a sum over the samples)",
            "the loss is not a sum over the samples (or such a sum over a count)",
            expected="a loss that adds up per-sample terms, as mean and sum losses do",
            got=f"{numerator.name} is {format_placements(placed[numerator.name])} "
                "on a batch split", fix="plan with microbatches=1")
    if isinstance(count, fx.Node):
        if placed[count.name] != partial or gradient_path(gm)[count.name]:
            raise _Mixing(
                f"the loss's divisor ({count.name}, not a count over the samples)",
                "the loss divides by a value that is not a count over the samples",
                expected="a divisor that depends on the inputs only and adds up over them",
                got=f"{count.name} is {format_placements(placed[count.name])}",
                fix="plan with microbatches=1")
        weighting = COUNTED
    elif count is None:
        weighting = SUMMED
    else:
        weighting = SCALED
    split = tuple(placed.get(n.name) == (Shard(0),) or (not n.users and _has_batch_dim(n, batch))
                  for n in _user_inputs(gm))
    constant = float(count) if weighting == SCALED else 1.0
    return BatchSplit(microbatches, batch, split, weighting, constant)


def _forward_split(gm: fx.GraphModule, microbatches: int, batch: int) -> BatchSplit:
    """The split of a forward-only graph: exact where it writes no buffer (a KV cache
    holds the whole batch's sequences) and each output comes out split along dim 0 on a
    batch split (the micro-batches' rows of it, concatenated back); `MicrobatchError`
    otherwise, whatever `mixing` says (a forward has no loss to accumulate)."""
    written = [n.name for n in written_buffers(gm)] + list(gm.meta.get(MUTATED, ()))
    if written:
        raise MicrobatchError("a forward that writes buffers (a KV cache) runs its batch whole",
                              expected="a forward that writes no buffer",
                              got=f"writes {', '.join(written)}", fix="microbatches=1")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    outputs = [v for v in output.args[0] if isinstance(v, fx.Node)]
    try:
        placed = _propagate(gm, outputs, microbatches, batch)
    except _Mixing as error:
        raise MicrobatchError(f"{error.mixes} mixes the samples of the batch: the forward "
                              "cannot run as micro-batches whose outputs are the batch's",
                              expected="ops that compute each sample's outputs on their own",
                              got=error.mixes, fix="microbatches=1") from None
    for value in outputs:
        if placed[value.name] != (Shard(0),):
            raise MicrobatchError(
                f"the output {value.name} is not made sample by sample",
                expected="outputs whose dim 0 is the batch's, each row of its own sample",
                got=f"{value.name} is {format_placements(placed[value.name])} on a batch split",
                fix="microbatches=1")
    split = tuple(placed.get(n.name) == (Shard(0),) or (not n.users and _has_batch_dim(n, batch))
                  for n in _user_inputs(gm))
    return BatchSplit(microbatches, batch, split, SUMMED)


class _Mixing(MicrobatchError):
    """A step whose ops or loss mix the samples of the batch; `mixes` names what does."""

    def __init__(self, mixes: str, what: str, **fields: str) -> None:
        super().__init__(what, **fields)
        self.mixes = mixes


def _has_batch_dim(node: fx.Node, batch: int) -> bool:
    # Inputs the loss does not read are cut like the others when they have the batch's dim
    # 0, so that the micro-batch's example inputs keep one shape convention; so is every
    # such input of a step that accumulates (nothing says which are the samples there).
    spec = node.meta.get(TENSOR)
    return isinstance(spec, TensorSpec) and spec.ndim > 0 and spec.shape[0] == batch


def loss_weights(split: BatchSplit, micro: fx.GraphModule
                 ) -> Callable[[list[list]], list[float]]:
    """The function from the micro-batches' flat inputs (`micro_inputs`) to their losses'
    weights w_i (see the module docstring), given `micro`, the graph captured at one
    micro-batch's shapes."""
    count = split.microbatches
    if split.weighting == SUMMED:
        return lambda inputs: [1.0] * count
    if split.weighting == ACCUMULATED:
        return lambda inputs: [1.0 / count] * count
    _, divisor = _numerator_and_count(_loss(micro))
    if split.weighting == SCALED:
        weight = float(divisor) / split.count
        return lambda inputs: [weight] * count
    counter = _count_function(micro, divisor)

    def weights(inputs: list[list]) -> list[float]:
        with torch.no_grad():
            counts = [float(counter(*flat)) for flat in inputs]
        total = sum(counts)
        return [c / total if total else 1.0 / count for c in counts]

    return weights


def _count_function(gm: fx.GraphModule, count: fx.Node) -> Callable[..., torch.Tensor]:
    """The loss's divisor `count` as a function of the flat user inputs. It must read inputs
    only (`split_microbatches` checked it is off the gradient path); `MicrobatchError` if it reads
    the model's state."""
    graph, env = fx.Graph(), {}
    for node in _user_inputs(gm):
        env[node] = graph.placeholder(node.name)
    needed = _ancestors(count)
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node not in needed:
            continue
        if any(a.op == "placeholder" and a not in env for a in node.all_input_nodes):
            raise MicrobatchError(
                "the loss's count reads the model's parameters or buffers",
                expected="a count computed from the inputs", got=node.name,
                fix="plan with microbatches=1")
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(env[count])
    return graph_module(gm, graph)


def _ancestors(node: fx.Node) -> set[fx.Node]:
    """`node` and every node it is computed from."""
    seen, stack = set(), [node]
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(current.all_input_nodes)
    return seen

