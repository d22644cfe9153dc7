"""A parameter the model does not train (`requires_grad_(False)`, a frozen embedding or
encoder when fine-tuning) is planned as what it is at run time: no gradient collectives, no
gradient, master copy or optimizer states in memory, no optimizer step. (Training such a
model on gloo next to the plain one: the corpus's `frozen_encoder`.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import autopar
from autopar.passes.capturing.gradient_path import gradient_path, trained
from autopar.tools.predicted_memory import graph_of, predicted_memory
from autopar.values.specs import NAMES, ROLE

VOCAB, WIDTH, CLASSES = 64, 32, 8
FROZEN = ("embed.weight", "encoder.weight", "encoder.bias")


class FrozenEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.encoder = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)
        self.embed.requires_grad_(False)
        self.encoder.requires_grad_(False)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.encoder(self.embed(ids))).mean(dim=1)
        return F.cross_entropy(self.head(hidden), labels)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, VOCAB, (8, 16), generator=generator),
            torch.randint(0, CLASSES, (8,), generator=generator))


def _parameter_nodes(graph):
    return {n.meta[NAMES][0]: n for n in graph.graph.nodes
            if n.op == "placeholder" and n.meta.get(ROLE) == "parameter"}


def test_frozen_parameters_are_off_the_gradient_path():
    graph = graph_of(FrozenEncoder(), _inputs())
    on_path = gradient_path(graph)
    for name, node in _parameter_nodes(graph).items():
        assert trained(node) == (name not in FROZEN), name
        assert on_path[node.name] == (name not in FROZEN), name


def test_a_frozen_parameter_has_no_gradient_collective_state_or_step():
    model, inputs = FrozenEncoder(), _inputs()
    mesh = autopar.Mesh((2,), ("x",), hardware="cpu")
    # The frozen layers split the batch, reading their weights replicated: trained weights
    # read so would have their gradients all-reduced.
    plan = autopar.plan(model, mesh, inputs, microbatches=1,
                        constraints={"embedding": "S(0)", "linear": "S(0)"})
    graph = graph_of(model, inputs)
    nodes = _parameter_nodes(graph)
    names = {node.name: name for name, node in nodes.items()}
    for node in plan.nodes:
        for transfer in node.transfers:
            if transfer.backward:
                assert names.get(transfer.tensor) not in FROZEN, transfer
    steps = {names[n.name]: n.optimizer_s for n in plan.nodes if n.name in names}
    assert all(steps[name] == 0.0 for name in FROZEN)
    assert all(steps[name] > 0.0 for name in steps if name not in FROZEN)

    parts = {p.name: p for p in predicted_memory(plan, graph).per_parameter}
    for name, part in parts.items():
        frozen = name in FROZEN
        assert (part.gradient == 0.0 and part.optimizer_states == 0.0) == frozen, part
        assert part.parameter > 0.0
