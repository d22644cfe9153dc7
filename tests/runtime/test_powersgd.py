"""Data-parallel gradients all-reduced as PowerSGD ("powersgd-R") on gloo ranks.

An MLP of 512 and 2048 features is planned on two data-parallel devices over the slow link
of `h100-ethernet`, the solver allowed PowerSGD of rank 2. Trained with SGD on two CPU
ranks, it follows DistributedDataParallel with torch's PowerSGD hook step for step (the
same pieces of the batch, the same hook settings): `POWERSGD_WARMUP` exact steps, then
rank-2 approximations with error feedback. The weights' all-reduces move their P and Q
once PowerSGD runs, the bytes the plan charges. A checkpoint saved after PowerSGD has run
carries its state: training resumed from it ends where the straight run does.
"""

from __future__ import annotations

import powersgd_workers
import pytest

import autopar
from autopar.costs.compression import low_rank_bytes
from autopar.runtime.launch import launch

MESH = autopar.Mesh((2,), ("dp",), hardware="h100-ethernet", links=("ethernet",))


def _plan(compression) -> autopar.Plan:
    model, inputs = powersgd_workers.build()
    return autopar.plan(model, MESH, inputs, strategy="data parallel",
                        compression=compression, time_limit=10.0)


@pytest.fixture(scope="module")
def trained():
    plan = _plan(("powersgd-2",))
    return plan, launch(powersgd_workers.train, 2, plan.to_dict(), timeout=300.0)


def test_the_weights_are_compressed_the_biases_are_not(trained):
    plan, _ = trained
    compressed = {n.name: n.compression for n in plan.nodes if n.role == "parameter"}
    assert {name for name, c in compressed.items() if c} == {"p_fc1_weight", "p_fc2_weight"}
    assert set(compressed.values()) == {"", "powersgd-2"}


def test_training_follows_ddp_with_the_powersgd_hook(trained):
    _, results = trained
    def global_losses(run: str) -> list[float]:
        # DDP's loss is each rank's mean over its half of the batch; ours, over the batch.
        return [sum(values) / len(values)
                for values in zip(*(result["losses"][run] for result in results))]

    theirs, exact = global_losses("ddp"), global_losses("exact")
    for result in results:
        ours = result["losses"]["autopar"]
        assert len(ours) == len(theirs) == powersgd_workers.STEPS
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(ours, theirs)), (ours, theirs)
        for name, want in result["reference"].items():
            got = result["params"][name]
            assert float((got - want).norm() / want.norm()) <= 1e-5, name
    # Exact for the warm-up, approximate after: the first loss PowerSGD's step changes.
    warmup = powersgd_workers.POWERSGD_WARMUP
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(theirs[:warmup + 1],
                                                           exact[:warmup + 1]))
    assert abs(theirs[warmup + 1] - exact[warmup + 1]) > 1e-4 * exact[warmup + 1]


def test_bytes_moved_are_the_plans_p_and_q(trained):
    plan, results = trained
    for result in results:
        assert result["measured"] == {k: v for k, v in result["predicted"].items() if v}
    exact = _plan(None).comm_bytes()
    key = ("all_reduce", "dp", "backward")
    hidden, ffn = powersgd_workers.SIZES["hidden"], powersgd_workers.SIZES["ffn"]
    saved = 2 * (hidden * ffn * 4 - low_rank_bytes((ffn, hidden), 2, 4))
    assert plan.comm_bytes()[key] == exact[key] - saved


def test_a_checkpoint_carries_the_error_feedback(trained, tmp_path):
    plan, _ = trained
    results = launch(powersgd_workers.resumed, 2, plan.to_dict(), str(tmp_path / "ckpt"),
                     timeout=300.0)
    for finals in results:
        names = [n for n in finals["straight"] if n.endswith("weight")]
        assert all(_off(finals, "resumed", name) <= 1e-4 for name in names)
        # Without PowerSGD's state the steps are other ones: the error is not fed back.
        assert all(_off(finals, "fresh", name) > 1e-2 for name in names)


def _off(finals: dict, run: str, name: str) -> float:
    """How far `run`'s steps after the checkpoint took parameter `name` from where the
    straight run's took it (relative to the straight run's steps)."""
    saved, straight = finals["saved"][name], finals["straight"][name]
    return float((finals[run][name] - straight).norm() / (straight - saved).norm())


def test_a_node_by_gpu_mesh_approximates_across_nodes_only():
    # Summed exactly inside each node, then PowerSGD across the nodes: as DDP with the
    # hook over the node axis, fed each node's half of the batch.
    mesh = autopar.Mesh((2, 2), ("node", "gpu"), hardware="h100-ethernet",
                        links=("ethernet", "nvlink"))
    model, inputs = powersgd_workers.build()
    plan = autopar.plan(model, mesh, inputs, strategy="data parallel",
                        compression=("powersgd-2",), time_limit=10.0)
    assert sum(n.compression == "powersgd-2" for n in plan.nodes) == 2
    bytes_moved = plan.comm_bytes()
    hidden, ffn = powersgd_workers.SIZES["hidden"], powersgd_workers.SIZES["ffn"]
    assert bytes_moved[("all_reduce", "gpu", "backward")] > 2 * hidden * ffn * 4  # exact
    assert bytes_moved[("all_reduce", "node", "backward")] < hidden * ffn * 4  # P and Q
    for result in launch(powersgd_workers.hierarchical, 4, plan.to_dict(), timeout=300.0):
        for name, want in result["reference"].items():
            got = result["params"][name]
            assert float((got - want).norm() / want.norm()) <= 1e-5, name
