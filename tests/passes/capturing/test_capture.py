"""capture: roles, names, module paths, the calling convention, meta models and errors."""

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from autopar.errors import CaptureError
from autopar.passes.capturing.capture import CONSTANTS, capture
from autopar.values.specs import MODULE, NAMES, ROLE


class TiedLM(nn.Module):
    """Embedding tied to the output head, a buffer, a non-persistent buffer, a constant."""

    def __init__(self, vocab: int = 11, hidden: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(2))
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("shift", torch.full((hidden,), 0.5))
        self.register_buffer("scale", torch.full((hidden,), 2.0), persistent=False)
        self.offset = torch.linspace(0, 1, hidden)  # a plain tensor attribute: a constant

    def forward(self, idx: torch.Tensor, targets: torch.Tensor):
        x = self.emb(idx) * self.scale + self.shift + self.offset
        for block in self.blocks:
            x = F.gelu(block(x))
        logits = self.head(x)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten()), None


def _inputs(vocab: int = 11, device: str = "cpu"):
    generator = torch.Generator().manual_seed(0)
    idx = torch.randint(0, vocab, (2, 5), generator=generator)
    targets = torch.randint(0, vocab, (2, 5), generator=generator)
    return idx.to(device), targets.to(device)


def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _run(gm: fx.GraphModule, model: nn.Module, inputs: tuple):
    """Call `gm` by its convention: state placeholders by canonical name, then the inputs."""
    state = {**dict(model.named_parameters()), **dict(model.named_buffers()),
             **gm.meta[CONSTANTS]}
    args = [state[n.meta[NAMES][0]] for n in _placeholders(gm) if n.meta[ROLE] != "input"]
    return gm(*args, *inputs)


@pytest.fixture(scope="module")
def tied():
    torch.manual_seed(0)
    model = TiedLM()
    return model, capture(model, _inputs())


def test_every_node_has_a_role_and_a_module(tied):
    _, gm = tied
    for node in gm.graph.nodes:
        assert node.meta[ROLE] in ("parameter", "buffer", "constant", "input", "op", "output")
        assert isinstance(node.meta[MODULE], str)
    roles = [n.meta[ROLE] for n in _placeholders(gm)]
    # State first, then the user inputs.
    assert roles[-2:] == ["input", "input"]
    assert {"parameter", "buffer", "constant"} <= set(roles[:-2])
    assert list(gm.graph.nodes)[-1].meta[ROLE] == "output"


def test_tied_weight_is_one_placeholder_with_both_names(tied):
    model, gm = tied
    names = [n.meta[NAMES] for n in _placeholders(gm) if n.meta[ROLE] == "parameter"]
    assert ("emb.weight", "head.weight") in names
    assert sum("emb.weight" in n for n in names) == 1
    canonical = {n[0] for n in names}
    assert canonical == set(dict(model.named_parameters()))


def test_buffers_and_constants_are_named(tied):
    _, gm = tied
    by_role = {}
    for node in _placeholders(gm):
        by_role.setdefault(node.meta[ROLE], []).append(node.meta.get(NAMES))
    assert sorted(by_role["buffer"]) == [("scale",), ("shift",)]
    assert by_role["constant"] == [("offset",)]
    assert by_role["input"] == [None, None]


def test_module_paths_are_the_innermost_module(tied):
    _, gm = tied
    by_target = {}
    for node in gm.graph.nodes:
        by_target.setdefault(str(node.target), []).append(node.meta[MODULE])
    assert by_target["aten.linear.default"] == ["blocks.0", "blocks.1", "head"]
    assert by_target["aten.embedding.default"] == ["emb"]
    assert set(by_target["aten.gelu.default"]) == {""}


def test_graph_runs_and_equals_the_model(tied):
    model, gm = tied
    inputs = _inputs()
    loss, nothing = _run(gm, model, inputs)
    expected, _ = model(*inputs)
    assert nothing is None
    torch.testing.assert_close(loss, expected)


def test_module_called_twice_keeps_its_path():
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(4, 4))

        def forward(self, x):
            return self.inner(self.inner(x))

    gm = capture(Twice(), (torch.randn(3, 4),))
    paths = [n.meta[MODULE] for n in gm.graph.nodes if n.op == "call_function"]
    assert paths == ["inner.0", "inner.0"]


def test_same_tensor_passed_twice_keeps_both_inputs():
    class Add(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, y):
            return self.fc(x) + y

    model, x = Add(), torch.randn(3, 4)
    gm = capture(model, (x, x))
    assert [n.meta[ROLE] for n in _placeholders(gm)].count("input") == 2
    (out,) = _run(gm, model, (x, x))
    torch.testing.assert_close(out, model(x, x))


def test_meta_model_captures_without_memory():
    with torch.device("meta"):
        model = TiedLM(vocab=50_000, hidden=4096)
    gm = capture(model, _inputs(vocab=50_000, device="meta"))
    vals = [n.meta["val"] for n in _placeholders(gm)]
    assert all(v.device.type == "meta" for v in vals)
    names = [n.meta.get(NAMES) for n in _placeholders(gm)]
    assert ("emb.weight", "head.weight") in names


def test_train_and_eval_mode_are_kept():
    dropouts = (torch.ops.aten.dropout.default, torch.ops.aten.native_dropout.default)

    def dropout_trains(model: nn.Module) -> bool:
        gm = capture(model, (torch.randn(2, 4),))
        nodes = [n for n in gm.graph.nodes if n.target in dropouts]
        # In eval mode dropout is the identity and may vanish from the graph.
        return bool(nodes) and all(n.args[2] for n in nodes)

    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).eval()
    assert not dropout_trains(model) and not model.training
    model.train()
    assert dropout_trains(model) and model.training


def test_data_dependent_control_flow_raises_capture_error():
    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x

    with pytest.raises(CaptureError, match="torch.cond") as info:
        capture(Branchy(), (torch.randn(3),))
    assert "data-dependent" in str(info.value)
    assert isinstance(info.value, TypeError)


def test_a_dynamic_dim_the_model_fixes_raises_capture_error():
    class FixedRows(nn.Module):
        def forward(self, x):
            return x.view(3, 4)  # only 6 rows fit: the "dynamic" batch is really 6

    batch = torch.export.Dim("batch")
    with pytest.raises(CaptureError, match="dynamic_shapes") as info:
        capture(FixedRows(), (torch.randn(6, 2),), dynamic_shapes=({0: batch},))
    assert "batch" in str(info.value)


def test_a_dynamic_dim_of_size_one_says_to_use_two():
    batch = torch.export.Dim("batch")
    with pytest.raises(CaptureError, match="at least 2"):
        capture(nn.Linear(2, 2), (torch.randn(1, 2),), dynamic_shapes=({0: batch},))


def test_inputs_must_be_a_tuple():
    with pytest.raises(CaptureError, match="tuple"):
        capture(nn.Linear(2, 2), [torch.randn(1, 2)])
