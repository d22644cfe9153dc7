"""`launch`, `init_from_env` and `device_mesh`: rank order, failures, the torchrun path."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time
from pathlib import Path

import launch_workers
import pytest
import torch

import autopar
from autopar.runtime import (
    LaunchArgumentError,
    LaunchError,
    ProcessGroupError,
    device_mesh,
    init_from_env,
)
from autopar.runtime import launch as launch_module
from autopar.runtime.launch import launch


def test_values_come_back_in_rank_order_with_torchrun_env():
    results = launch(launch_workers.report, 2, "hello")
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["init"] for r in results] == [0, 1]  # init_from_env: no-op, returns the rank
    assert [tuple(r["coordinate"]) for r in results] == [(0,), (1,)]
    for rank, r in enumerate(results):
        assert r["tag"] == "hello"
        assert r["env"]["RANK"] == str(rank) and r["env"]["WORLD_SIZE"] == "2"
        assert torch.equal(r["tensor"], torch.full((3,), float(rank)))
        assert "world size 2" in r["mismatch"] and "fix:" in r["mismatch"]
        assert r["errors"]["shape"].startswith("RedistributionError: local tensor")
        assert r["errors"]["dtype"].startswith("RedistributionError: local tensor")
        assert "without a backward" in r["errors"]["no backward"]
        assert "Regather scope" in r["errors"]["no scope"]
        assert r["counter"] == {}  # refused before any collective


def test_a_rank_that_raises_is_named_with_its_traceback():
    with pytest.raises(LaunchError) as info:
        launch(launch_workers.raise_on_rank_one, 2, grace=2.0)
    error = info.value
    assert error.rank == 1 and isinstance(error, RuntimeError)
    assert "rank 1 of 2 failed: ValueError: boom on rank 1" in str(error)
    assert "Traceback" in error.failures[1] and "raise_on_rank_one" in error.failures[1]


def test_a_rank_that_dies_mid_collective_does_not_hang_the_others():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(launch_workers.die_mid_collective, 2, grace=2.0)
    assert time.monotonic() - start < 60
    assert info.value.rank == 1
    assert "exited with code 1" in info.value.failures[1]


class _FakeProcess:
    def __init__(self, exitcode):
        self.exitcode = exitcode


def test_watchdog_times_out_and_notices_silent_deaths():
    results, failures, silent = launch_module._watch([_FakeProcess(None)], queue.Queue(),
                                                     timeout=0.3, grace=0.1)
    assert (results, failures, silent) == ({}, {}, [])
    error = launch_module._failure(1, results, failures, silent, 0.3)
    assert "did not finish within 0.3 s" in str(error) and error.rank is None
    results, failures, silent = launch_module._watch(
        [_FakeProcess(None), _FakeProcess(-9)], queue.Queue(), timeout=30, grace=0.1)
    assert silent == [1] and "SIGKILL" in failures[1][0]
    error = launch_module._failure(2, results, failures, silent, 30)
    assert error.rank == 1 and "terminated after" in error.failures[0]


def test_bad_launch_arguments():
    with pytest.raises(LaunchArgumentError):
        launch(launch_workers.report, 0)
    with pytest.raises(LaunchArgumentError) as info:
        launch(lambda rank: rank, 1)
    assert "fix:" in str(info.value)


def test_no_process_group():
    with pytest.raises(ProcessGroupError) as info:
        device_mesh(autopar.Mesh((2,), ("x",)))
    assert "fix:" in str(info.value) and isinstance(info.value, RuntimeError)


def test_init_from_env_without_torchrun(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ProcessGroupError) as info:
        init_from_env()
    assert "torchrun" in str(info.value)


def test_the_same_rank_function_runs_under_torchrun():
    script = Path(__file__).with_name("torchrun_script.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         "2", str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert (f"rank {rank} of 2: [0.0, 1.0, 2.0, 3.0] "
                "{('all_gather', 'x', 'forward'): 32}") in done.stdout
