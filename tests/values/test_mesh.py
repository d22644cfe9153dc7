"""Mesh and hardware profile validation."""

import json

import pytest

import autopar
from autopar.errors import HardwareError, MeshError


def test_innermost_axes_are_intra_node_by_default():
    mesh = autopar.Mesh((2, 8), ("dp", "tp"), hardware="h100-sxm")
    assert [link.name for link in mesh.axis_links] == ["infiniband", "nvlink"]
    assert mesh.size == 16


def test_axes_that_span_more_than_a_node_go_inter_node():
    mesh = autopar.Mesh((4, 4, 4), ("a", "b", "c"), hardware="a100-sxm")
    # c spans 4 devices, b x c spans 16 > 8 per node.
    assert [link.name for link in mesh.axis_links] == ["infiniband", "infiniband", "nvlink"]


def test_an_axis_with_several_devices_per_node_crosses_nodes_through_as_many_links():
    """A ring over whole hosts runs one channel per device of a host, each crossing the
    network through its own link: k x the per-device bandwidth, at most the host's."""
    hardware = autopar.Mesh((1,), ("x",), hardware="h100-sxm").hardware
    nvlink, network = (link.bandwidth for link in hardware.links)
    flat = autopar.Mesh((64,), ("dp",), hardware="h100-sxm")
    assert flat.axis_links[0].name == "infiniband"
    assert flat.axis_links[0].bandwidth == min(nvlink, 8 * network)
    # One device of each host in every group: the network's own figure.
    outer = autopar.Mesh((16, 8), ("dp", "tp"), hardware="h100-sxm")
    assert outer.axis_links[0].bandwidth == network
    # Groups of 4 at a stride of 4: two devices of a host of 8 in each.
    mixed = autopar.Mesh((4, 4, 4), ("a", "b", "c"), hardware="a100-sxm")
    a100 = mixed.hardware.links[1].bandwidth
    assert [link.bandwidth for link in mixed.axis_links[:2]] == [a100, 2 * a100]
    # A plan's mesh reads back with the same figures.
    assert autopar.Mesh.from_dict(mixed.to_dict()).axis_links == mixed.axis_links


def test_links_can_be_overridden():
    mesh = autopar.Mesh((8, 2), ("tp", "dp"), hardware="h100-sxm", links=("nvlink", "infiniband"))
    assert [link.name for link in mesh.axis_links] == ["nvlink", "infiniband"]


@pytest.mark.parametrize("shape, names", [((2, 0), ("a", "b")), ((2,), ("a", "b")),
                                          ((2, 2), ("a", "a")), ((-1,), ("a",))])
def test_invalid_meshes_raise_mesh_error(shape, names):
    with pytest.raises(MeshError) as info:
        autopar.Mesh(shape, names)
    assert "fix:" in str(info.value)
    assert isinstance(info.value, autopar.AutoparError) and isinstance(info.value, ValueError)


def test_unknown_link_name_is_rejected():
    with pytest.raises(MeshError, match="links"):
        autopar.Mesh((2,), ("dp",), hardware="h100-sxm", links=("pcie",))


def test_unknown_hardware_names_the_known_ones():
    with pytest.raises(HardwareError) as info:
        autopar.Mesh((2,), ("dp",), hardware="tpu-v9")
    assert "h100-sxm" in str(info.value) and "fix:" in str(info.value)


def test_bundled_profiles_have_published_figures():
    assert {"h100-sxm", "a100-sxm", "cpu"} <= set(autopar.available_hardware())
    h100 = autopar.load_hardware("h100-sxm")
    assert h100.memory_bytes == 80 * 2**30
    assert h100.flops_per_second(__import__("torch").bfloat16) == pytest.approx(989.4e12)
    assert h100.links[0].devices == 8


def test_profile_from_file_and_malformed_file(tmp_path):
    good = tmp_path / "dev.json"
    data = {"name": "dev", "peak_flops": {"float32": 1e12}, "memory_bytes": 2**30,
            "memory_bandwidth": 1e11, "links": [{"name": "net", "devices": None,
                                                 "bandwidth": 1e9, "latency": 1e-5}]}
    good.write_text(json.dumps(data))
    mesh = autopar.Mesh((4,), ("dp",), hardware=str(good))
    assert mesh.hardware.name == "dev"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad"}))
    with pytest.raises(HardwareError, match="malformed"):
        autopar.load_hardware(str(bad))


def test_mesh_round_trips_through_dict():
    mesh = autopar.Mesh((2, 4), ("dp", "tp"), hardware="a100-sxm")
    assert autopar.Mesh.from_dict(mesh.to_dict()) == mesh
