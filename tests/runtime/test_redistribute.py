"""`redistribute` on real gloo ranks: every placement pair on meshes (2,), (4,) and (2, 2).

Each mesh runs in one `launch` (process start costs seconds); the ranks run every case and
the parent checks, per case, that the forward output is `dst`'s layout of the value, that
the gradient of an upstream gradient laid out as the arriving-grad placement comes back as
`needed_grad(src)`'s layout of it, and that the measured bytes equal the cost model's
`edge_transfers` per (kind, axis, direction) exactly; of a shape the mesh does not divide
(DTensor's chunks, sent padded to the longest), rank 0's bytes, the most any rank moves.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from runtime_cases import UNEVEN, Case, cases, coordinate, global_tensor, layout, run_cases

from autopar.costs import formulas
from autopar.runtime import UnsupportedRedistributionError, transfer_totals
from autopar.runtime.launch import launch
from autopar.values.placement import Partial, Replicate, Shard, parse_placements

MESHES = {(2,): ("x",), (4,): ("x",), (2, 2): ("a", "b")}
CASES = {(2,): cases(1, nograd_cases=True) + cases(1, shape=UNEVEN),
         (4,): cases(1, nograd_cases=True) + cases(1, nograd_cases=True, shape=UNEVEN),
         (2, 2): cases(2) + cases(2, regather_cases=False, shape=UNEVEN)}


@pytest.fixture(scope="module")
def ran():
    results = {}

    def get(mesh_shape):
        if mesh_shape not in results:
            nprocs = len(list(itertools.product(*map(range, mesh_shape))))
            results[mesh_shape] = launch(run_cases, nprocs, mesh_shape, MESHES[mesh_shape],
                                         CASES[mesh_shape], timeout=240.0)
        return results[mesh_shape]

    return get


def _expected_unsupported(case: Case, mesh_shape) -> bool:
    try:
        case.redistribution(mesh_shape)
    except UnsupportedRedistributionError:
        return True
    return False


def _sum_over_partial(outs: dict, placements, coord) -> torch.Tensor:
    # A Partial value is checked through its sum over the ranks of each Partial axis.
    partial = [axis for axis, p in enumerate(placements) if isinstance(p, Partial)]
    return sum(out for c, out in outs.items()
               if all(c[a] == coord[a] for a in range(len(coord)) if a not in partial))


def _check(case: Case, index: int, mesh_shape, ranks: list[dict]) -> None:
    coords = [coordinate(rank, mesh_shape) for rank in range(len(ranks))]
    assert [r["coordinate"] for r in ranks] == coords
    results = [r["results"][index] for r in ranks]
    if _expected_unsupported(case, mesh_shape):
        assert all("unsupported" in r for r in results)
        return
    assert not any("unsupported" in r for r in results), results[0]
    r = case.redistribution(mesh_shape)
    value, grad = global_tensor(index, case.shape, 1), global_tensor(index, case.shape, 2)
    dst_as_r = tuple(Replicate() if isinstance(p, Partial) else p for p in r.dst)
    outs = {c: res["out"] for c, res in zip(coords, results)}
    names = MESHES[mesh_shape]
    expected_bytes = transfer_totals(case.transfers(mesh_shape), names)
    for c, res in zip(coords, results):
        assert res["out"].shape == layout(value, r.dst, c, mesh_shape, 0).shape
        torch.testing.assert_close(_sum_over_partial(outs, r.dst, c),
                                   layout(value, dst_as_r, c, mesh_shape, 0))
        if case.requires_grad:
            # needed_grad has no Partial: the layout is unique.
            needed = layout(grad, r.grad_needed, c, mesh_shape, 0)
            torch.testing.assert_close(res["grad"], needed)
        else:
            assert res["grad"] is None
        if case.shape == UNEVEN and any(c):  # rank 0 holds the longest pieces
            assert res["counter"].keys() == expected_bytes.keys()
            assert all(res["counter"][k] <= expected_bytes[k] for k in expected_bytes)
        else:
            assert res["counter"] == expected_bytes
        if case.regather and any(t.kind == "all_gather" for t in r.forward):
            assert res["freed"]
            assert res["weight_grad_error"] < 1e-12


@pytest.mark.parametrize("mesh_shape, index, case", [
    pytest.param(m, i, c, id=f"{'x'.join(map(str, m))}:{c.id}")
    for m, cs in CASES.items() for i, c in enumerate(cs)])
def test_edge(ran, mesh_shape, index, case):
    _check(case, index, mesh_shape, ran(mesh_shape))


def test_every_row_of_the_backward_table_is_covered():
    # docs/DESIGN.md's table: (src, dst, consumer output) -> forward, backward collective kinds.
    rows = [("P", "R", "R", ["all_reduce"], []),
            ("S(0)", "R", "R", ["all_gather"], []),
            ("S(0)", "R", "S(1)", ["all_gather"], ["reduce_scatter"]),
            ("R", "S(0)", "S(0)", [], ["all_gather"]),
            ("P", "S(0)", "S(0)", ["reduce_scatter"], ["all_gather"]),
            ("S(0)", "S(1)", "S(1)", ["all_to_all"], ["all_to_all"]),
            ("R", "R", "S(1)", [], ["all_reduce"])]
    for src, dst, consumer, forward, backward in rows:
        arriving = [c for c in CASES[(4,)] if (c.src, c.dst) == (src, dst) and not c.regather
                    and c.requires_grad and (c.consumer == "R") == (consumer == "R")]
        assert arriving, (src, dst, consumer)
        transfers = arriving[0].transfers((4,))
        assert [t.kind for t in transfers if not t.backward] == forward
        assert [t.kind for t in transfers if t.backward] == backward


def _regathers_more_than_gathers(case: Case, mesh_shape) -> bool:
    # A regathered parameter may only be gathered (Redistribution refuses the rest).
    forward = formulas.redistribute(1, parse_placements(case.src), parse_placements(case.dst),
                                    mesh_shape)
    return case.regather and forward is not None and any(
        t.kind != "all_gather" for t in forward)


def test_the_cost_model_forbids_exactly_the_edges_the_runtime_refuses():
    # The planner gives these edges infinite cost, so a plan never contains one.
    for mesh_shape, mesh_cases in CASES.items():
        for case in mesh_cases:
            refused = _expected_unsupported(case, mesh_shape)
            assert (case.transfers(mesh_shape) is None) == refused, (mesh_shape, case.id)


def test_unsupported_edges_reshard_one_dim_over_both_axes():
    # 1-D meshes support every edge; on 2-D, only edges whose steps touch a dim that two
    # axes shard are refused (they are not one collective per axis: see steps.py).
    for mesh_shape in ((2,), (4,)):
        assert not [c for c in CASES[mesh_shape] if _expected_unsupported(c, mesh_shape)
                    and not _regathers_more_than_gathers(c, mesh_shape)]
    unsupported = [c for c in CASES[(2, 2)] if _expected_unsupported(c, (2, 2))
                   and not _regathers_more_than_gathers(c, (2, 2))]
    assert unsupported
    for case in unsupported:
        src, dst = parse_placements(case.src), parse_placements(case.dst)
        dims = [{p.dim for p in (src[axis], dst[axis]) if isinstance(p, Shard)}
                for axis in range(2)]
        assert dims[0] & dims[1], case.id
