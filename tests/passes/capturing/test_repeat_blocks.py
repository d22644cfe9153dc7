"""repeat_blocks: a model captured with its identical blocks stamped is the graph a full trace
gives, node by node; models whose blocks differ are traced whole."""

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.utils import _pytree as pytree

import autopar
from autopar.passes.capturing import repeat_blocks
from autopar.passes.capturing.capture import capture
from examples import bert, gpt, llama, moe

LAYERS = 7


def _comparable_meta(node: fx.Node, first_seq_nr: int) -> dict[str, str]:
    """A node's meta as text: fake tensors by shape, strides, dtype and requires_grad;
    autograd's `seq_nr` counted from the graph's first (the counter is process-wide);
    `torch_fn` by its function (its call counter also counts calls that leave no node in a
    block, as `.contiguous()` of a contiguous tensor, which a stamp can't see); without
    `from_node` (provenance holding the ids of torch's intermediate graphs)."""
    shown = {}
    for key, value in node.meta.items():
        if key == "from_node":
            continue
        if key == "torch_fn":
            value = (value[0].rsplit("_", 1)[0] if value[0][-1].isdigit() else value[0],
                     value[1])
        if key == "val":
            value = [(tuple(t.shape), t.stride(), t.dtype, t.requires_grad)
                     if isinstance(t, torch.Tensor) else t for t in pytree.tree_leaves(value)]
        if key == "seq_nr":
            value -= first_seq_nr
        shown[key] = repr(value)
    return shown


def assert_same_graph(full: fx.GraphModule, stamped: fx.GraphModule) -> None:
    """Node by node: name, op, target, arguments and meta; then code and graph meta."""
    assert len(full.graph.nodes) == len(stamped.graph.nodes)
    first = [next((n.meta["seq_nr"] for n in gm.graph.nodes if "seq_nr" in n.meta), 0)
             for gm in (full, stamped)]
    for a, b in zip(full.graph.nodes, stamped.graph.nodes):
        assert (a.name, a.op, str(a.target), str(a.args), str(a.kwargs)) == \
            (b.name, b.op, str(b.target), str(b.args), str(b.kwargs))
        assert _comparable_meta(a, first[0]) == _comparable_meta(b, first[1]), a.name
    assert full.code == stamped.code
    assert {k: repr(v) for k, v in full.meta.items()} == \
        {k: repr(v) for k, v in stamped.meta.items()}


def _stamped(model: nn.Module, inputs: tuple, monkeypatch, **options) -> fx.GraphModule:
    """`capture` that fails the test unless the graph was stamped."""
    made = []
    real = repeat_blocks.capture_repeated

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr("autopar.passes.capturing.capture.capture_repeated", spy)
    gm = capture(model, inputs, **options)
    assert made and made[-1] is gm, "the blocks were not stamped"
    return gm


class _Loss(nn.Module):
    """A transformers model's loss from `(input_ids, labels)`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        return self.model(input_ids=ids, labels=labels).loss


def _hf_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    lm = LlamaForCausalLM(LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, use_cache=False,
        attn_implementation="sdpa"))
    lm.loss_type = "ForCausalLM"
    ids = torch.randint(0, 128, (2, 8))
    return _Loss(lm), (ids, ids)


def _hf_t5():
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(T5Config(
        vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=LAYERS, num_heads=4,
        dropout_rate=0.0, use_cache=False, decoder_start_token_id=0, pad_token_id=0,
        eos_token_id=1))
    ids = torch.randint(0, 128, (2, 8))
    return _Loss(model), (ids, ids)


def _encoder():
    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)

        def forward(self, x):
            return self.encoder(x).square().mean()

    return Encoder(), (torch.randn(2, 8, 32),)


MODELS = {
    "gpt": lambda: gpt.build(layers=LAYERS, batch=2),
    "llama": lambda: llama.build(layers=LAYERS, batch=2),
    "bert": lambda: bert.build(layers=LAYERS, batch=2),
    "hf_llama": _hf_llama,
    "hf_t5": _hf_t5,
    "torch_encoder": _encoder,
}


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.slow) if name == "hf_t5" else name
    for name in sorted(MODELS)])
def test_stamped_graph_is_the_full_trace(name, monkeypatch):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    full = capture(model, inputs, repeat_blocks=False)
    assert_same_graph(full, _stamped(model, inputs, monkeypatch))


def test_a_cached_model_served_is_stamped_with_its_cache_as_block_state(monkeypatch):
    # Each block writes its own KV cache buffers in place (`write_back`): block state
    # stamped like the weights, in export's order (every parameter before every buffer).
    torch.manual_seed(0)
    lm = _hf_llama()[0].model
    served = autopar.CachedLM(lm, batch=2, max_len=12)
    inputs = (torch.randint(0, 128, (2, 1)), torch.tensor([3]))
    full = capture(served, inputs, repeat_blocks=False, training=False)
    stamped = _stamped(served, inputs, monkeypatch, training=False)
    assert_same_graph(full, stamped)
    writes = [n for n in stamped.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert len(writes) == 2 * LAYERS


def test_a_loss_over_every_block_is_traced_whole():
    """moe's loss averages every block's balance loss after the blocks (a stack of one
    value per block, divided by their count): no stamp gives that, so the whole model is
    traced, and the capture is the full trace's."""
    model, inputs = moe.build(layers=LAYERS, batch=2)
    made = repeat_blocks.capture_repeated(
        model, inputs, lambda m, i: capture(m, i, repeat_blocks=False),
        mutated="autopar_mutated_buffers")
    assert made is None
    assert_same_graph(capture(model, inputs, repeat_blocks=False), capture(model, inputs))


def test_meta_models_at_depth_are_stamped(monkeypatch):
    """A 40-block model on the meta device: the same graph as its full trace."""
    model, inputs = llama.build(layers=40, hidden=32, heads=4, batch=2, seq=8, device="meta")
    assert_same_graph(capture(model, inputs, repeat_blocks=False),
                      _stamped(model, inputs, monkeypatch))


class Stack(nn.Module):
    """Blocks of a linear and an activation; `scales` sets each block's attribute."""

    def __init__(self, scales: list[float], index_blocks: bool = False,
                 shared: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(scale, i) for i, scale in enumerate(scales))
        if shared:
            for block in self.blocks:
                block.linear = self.blocks[0].linear
        self.index_blocks = index_blocks

    def forward(self, x):
        if self.index_blocks:  # reads every block by position, as some models do
            for i in range(8):
                x = self.blocks[i](x)
        else:
            for block in self.blocks:
                x = block(x)
        return x.square().mean()


class Block(nn.Module):
    def __init__(self, scale: float, index: int) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.scale, self.index = scale, index

    def forward(self, x):
        return F.gelu(self.linear(x)) * self.scale + x


@pytest.mark.parametrize("model, stamped", [
    (Stack([1.0] * 8), True),                    # identical, numbered by `index`: stamped
    (Stack([1.0] * 6 + [0.5, 1.0]), False),      # one block scales otherwise
    (Stack([1.0, 0.5] * 4), False),              # alternating blocks
    (Stack([1.0] * 8, index_blocks=True), False),  # the cut list can't be indexed to 8
    (Stack([1.0] * 8, shared=True), False),       # one weight under eight names
])
def test_which_models_are_stamped(model, stamped):
    """Only blocks identical but for a number are stamped; every capture equals the full
    trace, stamped or not."""
    x = torch.randn(2, 8)
    made = repeat_blocks.capture_repeated(
        model, (x,), lambda m, i: capture(m, i, repeat_blocks=False),
        mutated="autopar_mutated_buffers")
    assert (made is not None) == stamped
    full = capture(model, (x,), repeat_blocks=False)
    assert_same_graph(full, capture(model, (x,)))
