"""`autopar profile` (`autopar.tools.profile`): a measured profile that plans load, the
fit of a link, and bad profiles refused before any rank starts."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import autopar
from autopar.cli import main
from autopar.costs import formulas
from autopar.tools.profile import Settings, alpha_beta, profile, write_profile
from autopar.tools.profile.fit import exposed_share, monotone
from autopar.values.hardware import CollectiveFit, LinkLevel
from examples import mlp


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """A quick profile of a mesh of 2 measured on 2 gloo ranks, written to a file."""
    data = profile((2,), ("dp",), settings=Settings.quick())
    return write_profile(data, tmp_path_factory.mktemp("profile") / "measured.json")


def test_a_measured_profile_is_what_a_mesh_of_its_shape_plans_with(measured: Path) -> None:
    data = json.loads(measured.read_text())
    assert data["format"] == "autopar-profile" and data["version"] == 3
    assert data["device"] == "cpu"
    assert data["mesh"] == {"shape": [2], "axis_names": ["dp"]}
    assert set(data["peak_flops"]) == {"float32", "bfloat16"}
    assert all(v > 0 for v in data["peak_flops"].values())
    assert data["memory_bandwidth"] > 0 and 0 < data["launch_overhead_s"] < 1
    (link,) = data["links"]
    assert link["name"] == "dp" and link["devices"] is None and link["bandwidth"] > 0
    assert set(link["collectives"]) == {"all_reduce", "all_gather", "reduce_scatter",
                                        "all_to_all", "send"}
    assert all(f["bandwidth"] > 0 and f["latency"] >= 0 for f in link["collectives"].values())
    assert data["optimizer_element_s"] > 0 and data["optimizer_tensor_s"] >= 0
    assert 0 <= data["overlap_slowdown"] <= 1
    families = {"attention", "convolution", "transcendental"}
    assert set(data["kernel_flops"]) == families | {f"{f}.backward" for f in families}
    assert set(data["kernel_overhead_s"]) == set(data["kernel_flops"]) | {"matmul"}
    assert data["usable_memory_bytes"] <= data["memory_bytes"]
    assert {"copy", "launch", "autograd_op", "attention/32", "adamw/256",
            "links/dp/all_gather/4096"} <= set(data["measured"]["spread"])
    mesh = autopar.Mesh((2,), ("dp",), hardware=str(measured))
    assert mesh.hardware.mesh_shape == (2,) and mesh.axis_links[0].name == "dp"
    gather = link["collectives"]["all_gather"]
    assert mesh.axis_links[0].figures("all_gather") == (gather["bandwidth"], gather["latency"])
    # Its timings price the sizes it measured, and read between them.
    (small, t0), (large, t1) = gather["points"][:2]
    assert gather["ranks"] == 2 and t0 <= t1
    assert formulas.collective_time("all_gather", small, 2, mesh.axis_links[0]) == t0
    assert t0 <= formulas.collective_time("all_gather", (small + large) / 2, 2,
                                          mesh.axis_links[0]) <= t1
    model, inputs = mlp.build(device="meta")
    plan = autopar.plan(model, mesh, inputs, time_limit=5)
    assert plan.step_time_s > 0 and plan.mesh.hardware.name == "measured-2"


def test_the_fit_of_a_link_recovers_its_latency_and_bandwidth() -> None:
    alpha, beta, n = 3e-5, 2e9, 4
    times = {b: 2 * (n - 1) * alpha + 2 * (n - 1) / n * b / beta for b in (2**12, 2**20, 2**24)}
    latency, bandwidth = alpha_beta(n, times)
    assert latency == pytest.approx(alpha) and bandwidth == pytest.approx(beta)
    with pytest.raises(autopar.HardwareError, match="do not grow"):
        alpha_beta(n, {2**12: 2e-3, 2**20: 1e-3})


def test_timings_that_fall_with_the_size_are_pooled_into_their_mean() -> None:
    assert monotone({1: 3.0, 2: 1.0, 4: 5.0}) == [(1, 2.0), (2, 2.0), (4, 5.0)]
    assert monotone({4: 3.0, 1: 1.0, 2: 2.0}) == [(1, 1.0), (2, 2.0), (4, 3.0)]
    assert monotone({1: 4.0, 2: 3.0, 3: 2.0}) == [(1, 3.0), (2, 3.0), (3, 3.0)]


def test_the_exposed_share_is_what_running_side_by_side_fails_to_hide() -> None:
    # 10 ms of compute beside 4 ms of communication: all hidden at 10, none at 14.
    assert exposed_share(0.010, 0.004, 0.010) == 0.0
    assert exposed_share(0.010, 0.004, 0.014) == pytest.approx(1.0)
    assert exposed_share(0.010, 0.004, 0.011) == pytest.approx(0.25)
    # The longer may be the communication; contention beyond serial hides nothing either.
    assert exposed_share(0.004, 0.010, 0.012) == pytest.approx(0.5)
    assert exposed_share(0.004, 0.010, 0.020) == 1.0
    # Timing noise below the longer alone reads as all hidden.
    assert exposed_share(0.010, 0.004, 0.009) == 0.0


def test_a_link_prices_its_measured_sizes_by_their_timings() -> None:
    """Between two measured sizes the time is read off the line through them (beyond the
    last, through the last two); below the first, the first's; on a group of another
    size, or unmeasured, the fitted formula."""
    fit = CollectiveFit("all_reduce", 1e9, 1e-4, ((1e3, 1e-3), (1e6, 3e-3)), ranks=2)
    link = LinkLevel("net", None, 1e9, 1e-4, (fit,))
    assert formulas.collective_time("all_reduce", 1e3, 2, link) == 1e-3
    assert formulas.collective_time("all_reduce", 10, 2, link) == 1e-3
    assert formulas.collective_time("all_reduce", 500_500, 2, link) == pytest.approx(2e-3)
    assert formulas.collective_time("all_reduce", 1_999_000, 2, link) == pytest.approx(5e-3)
    assert formulas.collective_time("all_reduce", 1e3, 4, link) == pytest.approx(
        6 * 1e-4 + 1.5 * 1e3 / 1e9)
    assert formulas.collective_time("all_gather", 1e3, 2, link) == pytest.approx(
        1e-4 + 0.5 * 1e3 / 1e9)
    assert LinkLevel.from_dict(link.to_dict()) == link
    with pytest.raises(autopar.HardwareError, match="unordered or negative"):
        LinkLevel("net", None, 1e9, 1e-4, (dataclasses.replace(
            fit, points=((1e6, 3e-3), (1e3, 1e-3))),))


def _broken(measured: Path, tmp_path: Path, change) -> Path:
    data = copy.deepcopy(json.loads(measured.read_text()))
    change(data)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("change, match", [
    (lambda d: d.pop("memory_bandwidth"), "malformed"),
    (lambda d: d["links"][0].update(bandwidth=-1.0), "bandwidth -1.0"),
    (lambda d: d.update(version=4), "version 4"),
    (lambda d: d.update(format="other"), "format 'other'"),
], ids=["missing-field", "negative-bandwidth", "newer-version", "other-format"])
def test_a_broken_profile_is_refused_when_the_mesh_is_made(measured: Path, tmp_path: Path,
                                                           change, match: str) -> None:
    with pytest.raises(autopar.HardwareError, match=match):
        autopar.Mesh((2,), ("dp",), hardware=str(_broken(measured, tmp_path, change)))


def test_a_profile_of_another_mesh_shape_is_refused(measured: Path) -> None:
    with pytest.raises(autopar.MeshError, match="measured on a mesh of shape 2") as error:
        autopar.Mesh((4,), ("dp",), hardware=str(measured))
    assert "autopar profile --nproc 4 --mesh 4" in str(error.value)


def test_the_command_refuses_a_process_count_that_is_not_the_mesh(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    result = CliRunner().invoke(main, ["profile", "--nproc", "3", "--mesh", "2x2", "--out",
                                       str(out)])
    assert result.exit_code != 0 and "--nproc 4" in result.output and not out.exists()


def test_the_command_writes_a_profile(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    result = CliRunner().invoke(main, ["profile", "--nproc", "2", "--mesh", "2", "--axis-names",
                                       "tp", "--out", str(out), "--quick"])
    assert result.exit_code == 0, result.output
    assert "axis tp    all_reduce" in result.output and "profile written to" in result.output
    assert autopar.load_hardware(out).links[0].name == "tp"


def test_the_command_compares_with_a_profile_measured_before(measured: Path,
                                                            tmp_path: Path) -> None:
    """`--compare` prints how far each fitted figure moved: against a profile whose matmul
    rate is a hundred times the measured one, the new rate shows about -99%. (A factor that
    large: a shared machine's matmul rate moves by 2x between runs.)"""
    data = json.loads(measured.read_text())
    data["peak_flops"]["float32"] *= 100
    before = tmp_path / "before.json"
    before.write_text(json.dumps(data))
    out = tmp_path / "p.json"
    result = CliRunner().invoke(main, ["profile", "--nproc", "2", "--mesh", "2", "--out",
                                       str(out), "--quick", "--compare", str(before)])
    assert result.exit_code == 0, result.output
    line = next(t for t in result.output.splitlines() if "peak_flops.float32" in t)
    assert float(line.split()[-1].rstrip("%")) < -90
    assert "figures within 10%" in result.output
