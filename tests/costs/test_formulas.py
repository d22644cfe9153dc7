"""The cost model: collective formulas, roofline, and the derived backward table."""

import dataclasses

import pytest
import sympy
import torch

import autopar
from autopar.costs import formulas
from autopar.values.hardware import CollectiveFit, LinkLevel
from autopar.values.placement import Partial, Replicate, Shard
from autopar.values.specs import Kernels

R, P, S0, S1 = Replicate(), Partial(), Shard(0), Shard(1)


def kinds(transfers):
    return [(t.kind, t.axis, t.backward) for t in transfers]


@pytest.mark.parametrize("src, dst, consumer_out, forward, backward", [
    # docs/DESIGN.md's table, one row per case (1-D mesh of 4).
    (P, R, R, ["all_reduce"], []),                     # grad arrives R: nothing
    (S0, R, R, ["all_gather"], []),                    # grad R: slice
    (S0, R, S1, ["all_gather"], ["reduce_scatter"]),   # grad P: reduce-scatter
    (R, S0, S0, [], ["all_gather"]),                   # slice <-> all-gather
    (P, S0, S0, ["reduce_scatter"], ["all_gather"]),
    (S0, S1, S1, ["all_to_all"], ["all_to_all"]),
    (R, R, S1, [], ["all_reduce"]),                    # R used by a split op
    (R, R, R, [], []),
])
def test_backward_table(src, dst, consumer_out, forward, backward):
    transfers = formulas.edge_transfers(1024, (src,), (dst,), (consumer_out,), (4,),
                                        requires_grad=True)
    assert [t.kind for t in transfers if not t.backward] == forward
    assert [t.kind for t in transfers if t.backward] == backward


def test_no_backward_off_the_gradient_path():
    transfers = formulas.edge_transfers(1024, (R,), (R,), (S1,), (4,), requires_grad=False)
    assert transfers == ()


def test_buffer_sizes_follow_the_other_axes():
    # 2x4 mesh: gather axis 1 of a tensor also sharded on axis 0 moves the axis-0 shard.
    (gather,) = formulas.redistribute(800, (S0, S1), (S0, R), (2, 4))
    assert (gather.kind, gather.axis, gather.nbytes) == ("all_gather", 1, 400)


def test_slices_happen_before_gathers():
    # R->S on axis 1 first, so the all-reduce on axis 0 moves a quarter of the tensor.
    (reduce,) = formulas.redistribute(800, (P, R), (R, S1), (2, 4))
    assert (reduce.kind, reduce.axis, reduce.nbytes) == ("all_reduce", 0, 200)


def test_collective_formulas():
    bw, lat = 1e9, 1e-5
    link = LinkLevel("net", None, bw, lat)
    assert formulas.collective_time("all_reduce", 8e6, 4, link) == pytest.approx(
        2 * 3 / 4 * 8e6 / bw + 2 * 3 * lat)
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert formulas.collective_time(kind, 8e6, 4, link) == pytest.approx(
            3 / 4 * 8e6 / bw + 3 * lat)
    assert formulas.collective_time("all_reduce", 8e6, 1, link) == 0
    assert formulas.collective_time("send", 8e6, 2, link) == pytest.approx(8e6 / bw + lat)


def test_gradients_in_one_bucket_share_its_latency():
    """Gradients packed into one bucket pay their bandwidth terms and, together, the
    bucket's one latency; a gradient of a bucket's size or more pays all of it."""
    link = LinkLevel("net", None, 1e9, 1e-3)
    bucket = 1 << 20
    parts = [bucket // 4, bucket // 4, bucket // 2]
    shared = sum(formulas.bucketed_time("all_reduce", b, 2, link, bucket) for b in parts)
    assert shared == pytest.approx(formulas.collective_time("all_reduce", bucket, 2, link))
    assert shared < sum(formulas.collective_time("all_reduce", b, 2, link) for b in parts) / 2
    for alone in (bucket, 4 * bucket):
        assert formulas.bucketed_time("all_reduce", alone, 2, link, bucket) == \
            formulas.collective_time("all_reduce", alone, 2, link)
    assert formulas.bucketed_time("all_reduce", 1000, 2, link, 0) == \
        formulas.collective_time("all_reduce", 1000, 2, link)


def test_a_measured_kind_uses_its_own_figures():
    """A link with measured all-gather figures prices all-gathers by them, the other
    kinds by the level's own bandwidth and latency."""
    link = LinkLevel("net", None, 1e9, 1e-5, (CollectiveFit("all_gather", 2e9, 4e-5),))
    assert formulas.collective_time("all_gather", 8e6, 4, link) == pytest.approx(
        3 / 4 * 8e6 / 2e9 + 3 * 4e-5)
    assert formulas.collective_time("reduce_scatter", 8e6, 4, link) == pytest.approx(
        3 / 4 * 8e6 / 1e9 + 3 * 1e-5)


def test_optimizer_time():
    """Datasheet: a memory-bound pass over 28 bytes per fp32 AdamW element; measured: the
    profile's per-tensor and per-element seconds, scaled by the bytes moved."""
    h100 = autopar.load_hardware("h100-sxm")
    bandwidth = h100.memory_bandwidth * h100.memory_efficiency
    assert formulas.optimizer_time(1e9, 4, 8, h100) == pytest.approx(
        h100.launch_overhead_s + 28e9 / bandwidth)
    measured = dataclasses.replace(h100, optimizer_tensor_s=1e-5, optimizer_element_s=2e-9)
    assert formulas.optimizer_time(1e6, 4, 8, measured) == pytest.approx(1e-5 + 2e-3)
    # bf16 parameters with fp32 master copy and states: 3 x 2 + 2 x 12 = 30 bytes.
    assert formulas.optimizer_time(1e6, 2, 12, measured) == pytest.approx(
        1e-5 + 2e-3 * 30 / 28)
    assert formulas.optimizer_time(0, 4, 8, measured) == 0


def test_roofline_picks_the_binding_resource():
    h100 = autopar.load_hardware("h100-sxm")
    peak = h100.flops_per_second(torch.bfloat16) * h100.compute_efficiency
    bandwidth = h100.memory_bandwidth * h100.memory_efficiency
    assert formulas.compute_time(1e12, 1, torch.bfloat16, h100) == pytest.approx(
        1e12 / peak + h100.launch_overhead_s)
    assert formulas.compute_time(1, 1e9, torch.bfloat16, h100) == pytest.approx(
        1e9 / bandwidth + h100.launch_overhead_s)
    train = formulas.training_compute_time(1e12, 1, torch.bfloat16, h100, differentiable=True)
    assert train == pytest.approx(3e12 / peak + 2 * h100.launch_overhead_s)


def test_a_family_with_a_measured_bandwidth_streams_its_bytes_at_it():
    """A profile's matmul bandwidth (a batched matrix-vector product's) prices memory-bound
    matmuls; other families keep the profile's memory bandwidth."""
    h100 = autopar.load_hardware("h100-sxm")
    measured = dataclasses.replace(h100, kernel_bandwidths=(("matmul", 1e11),))
    assert formulas.compute_time(1, 1e9, torch.bfloat16, measured, "matmul") == \
        pytest.approx(1e9 / 1e11 + h100.launch_overhead_s)
    assert formulas.compute_time(1, 1e9, torch.bfloat16, measured, "other") == \
        formulas.compute_time(1, 1e9, torch.bfloat16, h100, "other")
    assert autopar.HardwareProfile.from_dict(measured.to_dict()) == measured
    with pytest.raises(autopar.HardwareError, match="kernel_bandwidth.matmul=0"):
        dataclasses.replace(h100, kernel_bandwidths=(("matmul", 0.0),))


def test_costs_are_symbolic_over_symbolic_sizes():
    batch = sympy.Symbol("s0")
    h100 = autopar.load_hardware("h100-sxm")
    time = formulas.compute_time(2 * batch * 4096 * 4096, 4 * batch * 4096, torch.float32, h100)
    assert time.free_symbols == {batch}
    (transfer,) = formulas.redistribute(4 * batch, (P,), (R,), (8,))
    t = transfer.time(autopar.Mesh((8,), ("tp",), hardware="h100-sxm"))
    assert float(t.subs(batch, 1024)) == pytest.approx(
        formulas.collective_time("all_reduce", 4096, 8, LinkLevel("nvlink", 8, 4.5e11, 1e-6)))


def test_compute_divisor():
    assert formulas.compute_divisor(((S0,), (R,)), (S0,), (4,)) == 4
    assert formulas.compute_divisor(((S1,), (S0,)), (P,), (4,)) == 4   # contraction split
    assert formulas.compute_divisor(((P,), (P,)), (P,), (4,)) == 1     # P + P: full work
    assert formulas.compute_divisor(((S0, R),), (S0, R), (2, 4)) == 2


def test_sharded_parameters_are_gathered_again_for_the_backward():
    # ZeRO-3: all-gather forward, all-gather again and reduce-scatter backward.
    transfers = formulas.edge_transfers(1024, (S0,), (R,), (S1,), (4,), requires_grad=True,
                                        regather=True)
    assert [(t.kind, t.backward) for t in transfers] == [
        ("all_gather", False), ("all_gather", True), ("reduce_scatter", True)]


def test_a_traced_op_pays_a_launch_per_kernel_and_moves_its_multiples_of_its_bytes():
    cpu = autopar.load_hardware("cpu")
    launch, bandwidth = cpu.launch_overhead_s, cpu.bytes_per_second()
    norm = Kernels(forward=6, backward=14, forward_bytes=3.5, backward_bytes=12.0)
    forward = formulas.training_compute_time(0, 1e6, torch.float32, cpu, differentiable=False,
                                             kernels=norm)
    assert forward == pytest.approx(3.5e6 / bandwidth + 6 * launch)
    both = formulas.training_compute_time(0, 1e6, torch.float32, cpu, differentiable=True,
                                          kernels=norm)
    assert both == pytest.approx(forward + 12e6 / bandwidth + 14 * launch)
    # A view: no forward kernel, a backward that runs one.
    view = Kernels(forward=0, backward=1, forward_bytes=0.0, backward_bytes=3.0)
    assert formulas.training_compute_time(0, 1e6, torch.float32, cpu, differentiable=False,
                                          kernels=view) == 0
    assert formulas.training_compute_time(0, 1e6, torch.float32, cpu, differentiable=True,
                                          kernels=view) == pytest.approx(3e6 / bandwidth
                                                                         + launch)


def test_a_backward_runs_at_the_rate_measured_for_it():
    cpu = autopar.load_hardware("cpu")
    measured = dataclasses.replace(cpu, compute_efficiency=1.0, kernel_flops=(
        ("attention", 1e10), ("attention.backward", 5e9)))
    forward = formulas.compute_time(1e9, 1, torch.float32, measured, "attention")
    both = formulas.training_compute_time(1e9, 1, torch.float32, measured,
                                          differentiable=True, family="attention")
    assert forward == pytest.approx(1e9 / 1e10 + cpu.launch_overhead_s, rel=1e-3)
    assert both - forward == pytest.approx(2e9 / 5e9 + cpu.launch_overhead_s, rel=1e-3)
    # Without a measured backward, the forward's rate.
    plain = dataclasses.replace(measured, kernel_flops=(("attention", 1e10),))
    assert formulas.training_compute_time(1e9, 1, torch.float32, plain, differentiable=True,
                                          family="attention") == pytest.approx(
        3e9 / 1e10 + 2 * cpu.launch_overhead_s, rel=1e-3)
