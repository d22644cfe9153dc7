"""The example models: they train on CPU, are deterministic, and capture (on CPU and meta)."""

import functools
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.values.specs import FLOPS, MODULE, NAMES, ROLE
from examples import bert, gpt, llama, mlp, moe, resnet

EXAMPLES = [mlp, gpt, llama, bert, moe, resnet]


@functools.cache
def _captured(example):
    """(model, inputs, annotated graph) of the default config, shared by the tests."""
    model, inputs = example.build()
    return model, inputs, annotate(capture(model, inputs))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.__name__)
def test_forward_backward_gives_a_finite_scalar_loss(example):
    model, inputs = example.build()
    loss = model(*inputs)
    loss.backward()
    assert loss.ndim == 0 and math.isfinite(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.__name__)
def test_build_is_deterministic_in_its_seed(example):
    (a, inputs_a), (b, inputs_b) = example.build(seed=3), example.build(seed=3)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert all(torch.equal(x, y) for x, y in zip(inputs_a, inputs_b, strict=True))
    c, _ = example.build(seed=4)
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.__name__)
def test_captured_graph_computes_the_loss(example):
    model, inputs, gm = _captured(example)
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    args = [state[n.meta[NAMES][0]] for n in gm.graph.nodes
            if n.op == "placeholder" and n.meta[ROLE] != "input"]
    (loss,) = gm(*args, *inputs)
    torch.testing.assert_close(loss, model(*inputs))
    assert sum(n.meta[FLOPS] for n in gm.graph.nodes) > 0


@pytest.mark.parametrize("example", [gpt, llama, bert, moe], ids=lambda e: e.__name__)
def test_meta_build_captures_with_layers_as_modules_layers_i(example):
    model, inputs = example.build(layers=3, device="meta")
    assert all(p.is_meta for p in model.parameters())
    gm = capture(model, inputs)
    blocks = {n.meta[MODULE].split(".")[1] for n in gm.graph.nodes
              if n.meta[MODULE].startswith("layers.")}
    assert blocks == {"0", "1", "2"}


def test_gpt_head_is_tied_to_the_token_embedding():
    model, _, gm = _captured(gpt)
    assert model.lm_head.weight is model.wte.weight
    names = [n.meta.get(NAMES) for n in gm.graph.nodes if n.op == "placeholder"]
    assert ("wte.weight", "lm_head.weight") in names


def test_llama_uses_grouped_query_attention_and_fused_norms():
    model, _, gm = _captured(llama)
    attention = model.layers[0].attn
    assert attention.kv_heads < attention.heads
    targets = {str(n.target) for n in gm.graph.nodes}
    assert {"aten.rms_norm.default", "aten.scaled_dot_product_attention.default",
            "aten.silu.default"} <= targets


def test_llama_3_8b_shape_builds_on_meta():
    model, (idx, targets) = llama.build(layers=32, hidden=4096, heads=32, kv_heads=8,
                                        ffn=14336, vocab=128256, seq=4096, batch=1,
                                        device="meta", dtype=torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    assert 8.0e9 < params < 8.1e9
    assert idx.shape == targets.shape == (1, 4096) and idx.is_meta


def test_the_training_script_trains_under_torchrun(tmp_path):
    # Run from another folder, as a user would after `pip install -e .`.
    script = Path(__file__).resolve().parents[1] / "examples" / "train.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         "2", str(script), "--example", "mlp", "--mesh", "2", "--steps", "3",
         "--set", "hidden=64", "--set", "ffn=256", "--set", "batch=16",
         "--memory-budget", "400000"],  # below the replicated peak: the plan must split
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"loss +([0-9.]+)", done.stdout)]
    assert len(losses) == 3 and losses[-1] < losses[0], done.stdout
    # Measured bytes per collective equal the plan's, and there is at least one.
    rows = re.findall(r"^(\w+) +\w+ +\w+ +([0-9,]+) +([0-9,]+) +(\w+)$", done.stdout, re.M)
    assert rows and all(match == "yes" and m == p for _, m, p, match in rows), done.stdout
