"""The published measurements `benchmarks/published.py` and `published_megatron.py`
compare with: the profile of the hardware they ran on, and the cases as the benchmarks
build them (shapes and batches that reproduce every published MFU by torchtitan's formula,
and Megatron-LM's table's MFUs from its teraFLOP/s). No planning: seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import autopar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import published  # noqa: E402
import published_megatron  # noqa: E402


def test_grand_teton_profile_is_the_h100_of_the_published_runs() -> None:
    teton, sxm = autopar.load_hardware("h100-grand-teton"), autopar.load_hardware("h100-sxm")
    assert teton.memory_bytes == 94 * 2**30  # 94 GB HBM2e
    assert teton.memory_bandwidth == 2.4e12
    assert teton.peak_flops == sxm.peak_flops  # the same die and rated clock
    assert teton.compute_efficiency == 0.5  # the 500 W power limit (docs/DESIGN.md)
    assert [(link.devices, link.bandwidth) for link in teton.links] == [(8, 4.5e11),
                                                                       (None, 5e10)]
    mesh = autopar.Mesh((16, 8), ("dp", "tp"), hardware="h100-grand-teton")
    assert [link.name for link in mesh.axis_links] == ["rdma", "nvlink"]


@pytest.mark.parametrize("name", sorted(published.CASES))
def test_cases_reproduce_the_published_mfu(name: str) -> None:
    case = published.CASES[name]
    model, (ids, labels) = published.build_case(case)
    assert ids.shape == (case.local_batch * case.data_parallel, published.SEQ)
    params = sum(p.numel() for p in model.parameters())
    flops = published.torchtitan_flops_per_token(case.shape, params, case.mfu_embedding)
    mfu = case.tokens_per_s * flops / published.TORCHTITAN_PEAK[case.gpu]
    if case.mfu is not None:
        assert mfu == pytest.approx(case.mfu, abs=0.001)
    else:  # Table 1 and 3's runs: "33% to 39% MFU" with torch.compile or without
        assert 0.32 < mfu < 0.39


@pytest.mark.parametrize("size", sorted(published_megatron.CASES))
def test_megatron_rows_reproduce_their_mfu(size: str) -> None:
    """Megatron-LM's table: its teraFLOP/s a GPU over the H100's 989 are its MFU (to the
    percent it prints), and the step they imply from `megatron_flops` is that
    throughput; the GPT built has the row's shape (GPT-2 classes, 4 x hidden MLP)."""
    run = published_megatron.CASES[size]
    assert run.tflops * 1e12 / published_megatron.H100_PEAK == pytest.approx(run.mfu, abs=0.0051)
    assert run.gpus == run.tp * run.pp * run.dp
    model, (ids, _) = published_megatron.build(run, batch=1)
    assert ids.shape == (1, published_megatron.SEQ)
    block = model.lm.transformer.h[0]
    assert len(model.lm.transformer.h) == run.layers
    assert block.mlp.c_fc.weight.shape == (run.hidden, 4 * run.hidden)
    assert model.lm.config.n_head == run.heads
