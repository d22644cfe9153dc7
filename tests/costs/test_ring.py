"""The ring's bytes and exposed time (`autopar.costs.ring`), against its formulas."""

import pytest
import torch

import autopar
from autopar.costs.ring import BACKWARD_LAUNCHES, FORWARD_LAUNCHES, ring_of
from autopar.rules.base import OpSpec
from autopar.values.placement import Replicate, Shard
from autopar.values.specs import TensorSpec

aten = torch.ops.aten
MESH = autopar.Mesh((8,), ("cp",), hardware="h100-sxm")


def _attention(causal: bool, heads: int = 32, kv_heads: int = 8, length: int = 8192,
               dtype=torch.bfloat16) -> OpSpec:
    q = TensorSpec((1, heads, length, 128), dtype)
    kv = TensorSpec((1, kv_heads, length, 128), dtype)
    return OpSpec(aten.scaled_dot_product_attention.default, (q, kv, kv),
                  {"is_causal": causal, "enable_gqa": kv_heads != heads}, (q, kv, kv), (q,))


def _ring(causal: bool, **sizes):
    split = (Shard(2),)
    return ring_of(_attention(causal, **sizes), (split, split, split), split, MESH.shape)


def test_a_ring_moves_its_blocks_and_their_gradients():
    ring = _ring(causal=False)
    local = 1 * 8 * 1024 * 128 * 2  # one rank's keys: 1024 of 8192 positions, bf16
    assert ring.kv_bytes == 2 * local and ring.grad_bytes == 2 * 2 * local  # fp32 grads
    sent = ring.transfers(differentiable=True)
    forward = sum(t.nbytes for t in sent if not t.backward)
    backward = sum(t.nbytes for t in sent if t.backward)
    assert forward == 7 * ring.kv_bytes
    assert backward == 7 * (ring.kv_bytes + ring.grad_bytes) + ring.kv_bytes
    assert all(t.kind == "send" and t.axis == 0 for t in sent)
    assert sum(not t.backward for t in ring.transfers(differentiable=False)) == 7


def test_causal_rings_swap_half_the_queries_and_the_outputs_back():
    ring, plain = _ring(causal=True), _ring(causal=False)
    assert ring.balanced and not plain.balanced
    half = 1 * 32 * 512 * 128 * 2  # 512 of each rank's 1024 query rows, 32 heads
    assert ring.query_half_bytes == ring.output_half_bytes == half
    extra = sum(t.nbytes for t in ring.transfers(differentiable=True)) - sum(
        t.nbytes for t in plain.transfers(differentiable=True))
    assert extra == 4 * half  # Q/2 and O/2 forward, dO/2 and dQ/2 backward
    assert ring.blocks == 2 * 8 + 1 and plain.blocks == 8


def test_an_odd_ring_is_not_balanced():
    mesh = autopar.Mesh((3,), ("cp",), hardware="h100-sxm")
    split = (Shard(2),)
    ring = ring_of(_attention(True, length=3 * 1024), (split,) * 3, split, mesh.shape)
    assert not ring.balanced and ring.query_half_bytes == 0


def test_compute_hides_the_blocks_but_not_the_swaps():
    ring = _ring(causal=True)
    link = MESH.axis_links[0]

    def send(nbytes):
        return nbytes / link.bandwidth + link.latency

    swaps = send(ring.query_half_bytes) + send(ring.output_half_bytes)
    hidden = ring.exposed_seconds(1.0, 2.0, MESH, differentiable=True)
    assert hidden == pytest.approx(2 * swaps + send(ring.kv_bytes))
    exposed = ring.exposed_seconds(0.0, 0.0, MESH, differentiable=True)
    assert exposed == pytest.approx(hidden + 7 * send(ring.kv_bytes)
                                    + 7 * send(ring.kv_bytes + ring.grad_bytes))


def test_the_ring_pays_a_launch_per_kernel_it_adds():
    ring = _ring(causal=False)
    launch = MESH.hardware.launch_overhead_s
    assert ring.launch_seconds(MESH.hardware, differentiable=False) == pytest.approx(
        (8 * FORWARD_LAUNCHES - 1) * launch)
    assert ring.launch_seconds(MESH.hardware, differentiable=True) == pytest.approx(
        (8 * (FORWARD_LAUNCHES + BACKWARD_LAUNCHES) - 2) * launch)


def test_attention_without_split_keys_runs_no_ring():
    split, whole = (Shard(2),), (Replicate(),)
    assert ring_of(_attention(False), (split, whole, whole), split, MESH.shape) is None
