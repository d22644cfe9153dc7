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
from autopar.tools.profile import Settings, alpha_beta, profile, timing, write_profile
from autopar.tools.profile.fit import line, monotone
from autopar.tools.profile.timing import Timing, calls_lasting, combined, interquartile_mean, pooled
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
    assert data["overlap_slowdown"] >= 0
    families = {"attention", "convolution", "transcendental"}
    assert set(data["kernel_flops"]) == families | {f"{f}.backward" for f in families}
    assert set(data["kernel_overhead_s"]) == set(data["kernel_flops"]) | {"matmul"}
    assert data["usable_memory_bytes"] <= data["memory_bytes"]
    assert {"copy", "launch/attention", "launch/matmul/torch.float32", "autograd_op",
            "attention/1", "attention/32", "adamw/256",
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


def test_a_fit_takes_its_intercept_from_the_small_sizes_and_its_slope_from_the_large() -> None:
    """The intercept from the sizes it dominates (t < 2 t0), the slope from the others:
    noise at the large sizes moves the slope a little and the intercept hardly, where a
    free least-squares intercept would move by as much as itself."""
    assert line({1: 2.0, 11: 3.0, 101: 12.0}) == (pytest.approx(1.9), pytest.approx(0.1))
    # 10% of noise on the largest times: the slope moves, the intercept stays near t0.
    intercept, slope = line({1: 1.0, 1001: 10.0 * 1.1, 2001: 20.0 * 0.9})
    w1, w2 = 1 / 11.0**2, 1 / 18.0**2
    expected = (w1 * 1000 * 10.0 + w2 * 2000 * 17.0) / (w1 * 1000**2 + w2 * 2000**2)
    assert slope == pytest.approx(expected) and intercept == pytest.approx(1.0 - expected)
    assert 0.99 < intercept < 1.0
    # The sizes the intercept dominates are pooled (their mean point), so that opposite
    # noise on them cancels: t = 1 + 0.01 x, with 1 and 50 off it by -0.1 and +0.1.
    exact = {1: 1.01, 50: 1.5, 1000: 11.0, 2000: 21.0}
    assert line(exact) == (pytest.approx(1.0), pytest.approx(0.01))
    assert line({**exact, 1: 0.91, 50: 1.6}) == pytest.approx(line(exact))
    # Small sizes below the line the others give them (a negative intercept): the line
    # through the origin instead.
    intercept, slope = line({10: 0.1, 20: 1.2, 40: 3.2})
    assert intercept == 0.0 and slope == pytest.approx(
        (10 / 0.1 + 20 / 1.2 + 40 / 3.2) / (100 / 0.01 + 400 / 1.44 + 1600 / 3.2**2))


def test_a_timing_is_the_mean_of_the_middle_half_of_its_samples() -> None:
    assert interquartile_mean([1.0, 2.0, 3.0, 4.0, 100.0]) == 3.0
    assert interquartile_mean([5.0, 1.0, 3.0]) == 3.0
    assert interquartile_mean([9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 50.0]) == 4.5
    t = Timing.of([0.1, 0.2, 0.3, 0.4, 10.0])
    assert t.typical == pytest.approx(0.3) and t.median == 0.3 and t.mean == pytest.approx(2.2)


def test_kernels_take_the_slowest_rank_and_collectives_every_rank() -> None:
    """A kernel's k-th timings ran side by side and a step waits for the slowest; a
    collective's ranks each time the same collective, so all their samples count."""
    a, b = Timing.of([1.0, 4.0, 2.0, 2.0]), Timing.of([3.0, 1.0, 1.0, 5.0])
    slowest = combined([a, b])
    assert slowest.samples == (3.0, 4.0, 2.0, 5.0) and slowest.typical == pytest.approx(3.5)
    every = pooled([a, b])
    assert sorted(every.samples) == [1.0, 1.0, 1.0, 2.0, 2.0, 3.0, 4.0, 5.0]
    assert every.typical == pytest.approx(2.0)
    # The spread: the larger of the ranks' medians' range and each one's own.
    assert slowest.spread == every.spread == pytest.approx(max(0.0, (3 - 1) / 2, (5 - 1) / 2))


def test_a_batch_lasts_the_time_asked_for_by_a_batch_not_a_single_call(monkeypatch) -> None:
    """Calls of about 1 ms: batches of 1, 2, ..., 32 calls until one lasts a quarter of
    0.1 s (32 calls, 31 ms), then 32 calls scaled to 0.1 s, 103."""
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

    def run() -> None:
        clock[0] += 2**-10
    assert calls_lasting(run, 0.1) == 103
    assert clock[0] == 63 * 2**-10  # 1 + 2 + ... + 32 calls
    clock[0] = 0.0
    assert calls_lasting(lambda: clock.__setitem__(0, clock[0] + 1.0), 0.1) == 1
    # Every rank times as many calls: the count the ranks agree on, not its own 103.
    clock[0] = 0.0
    t = timing.timed(run, 2, agree=lambda count: 2 * count)
    assert t.samples == (2**-10, 2**-10)
    assert clock[0] == (1 + 63 + 2 * 206) * 2**-10  # the first call, the batches, 2 timings


def test_two_calls_timed_as_a_pair_alternate_their_timings(monkeypatch) -> None:
    """A difference of two timings (a kernel's launch beyond a dispatch) is taken between
    timings that ran one after the other: batches of each in turn, every one aligned."""
    clock, calls, aligned = [0.0], [], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

    def call(name: str, seconds: float):
        def run() -> None:
            calls.append(name)
            clock[0] += seconds
        return run
    a, b = timing.timed_pair(call("a", 2**-7), call("b", 2**-6), 2,
                             align=lambda: aligned.append(len(calls)))
    # Counts: 13 calls of a and 7 of b last MIN_TIMING_S (0.1 s), after each one's first
    # call and its batches of 1, 2, 4 (a) and 1, 2 (b) calls.
    assert "".join(calls[:12]) == "a" * 8 + "b" * 4
    assert "".join(calls[12:]) == "a" * 13 + "b" * 7 + "a" * 13 + "b" * 7
    assert a.samples == (2**-7, 2**-7) and b.samples == (2**-6, 2**-6)
    assert aligned == [12, 25, 32, 45, 52]


def test_timings_that_fall_with_the_size_are_pooled_into_their_mean() -> None:
    assert monotone({1: 3.0, 2: 1.0, 4: 5.0}) == [(1, 2.0), (2, 2.0), (4, 5.0)]
    assert monotone({4: 3.0, 1: 1.0, 2: 2.0}) == [(1, 1.0), (2, 2.0), (4, 3.0)]
    assert monotone({1: 4.0, 2: 3.0, 3: 2.0}) == [(1, 3.0), (2, 3.0), (3, 3.0)]


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
