"""`keep_freed_memory`: CPU training steps stop page-faulting their tensors back in."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import launch_workers

from autopar.runtime.launch import launch

# A step's first run faults its tensors in; a few more let the optimizer's state settle.
WARM_UP_STEPS = 3
# glibc's initial thresholds (128 KiB), set explicitly: left to itself, glibc adapts them to
# what the process freed before, so whether the steps fault depends on the imports.
_GLIBC_INITIAL = ("import ctypes; libc = ctypes.CDLL(None); "
                  "libc.mallopt(-3, 128 << 10); libc.mallopt(-1, 128 << 10)")


def _in_fresh_process(statements: str) -> list:
    """The JSON that `statements` print last, run in a new interpreter that imported
    autopar, torch (one thread) and launch_workers."""
    code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import autopar, launch_workers, torch; torch.set_num_threads(1); {statements}")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    return json.loads(out.splitlines()[-1])


def test_glibc_malloc_is_what_this_machine_runs():
    # Everything below assumes glibc (keep_freed_memory is a no-op elsewhere).
    assert platform.libc_ver()[0] == "glibc"


def test_steps_fault_no_pages_once_memory_is_kept():
    kept, before, after = _in_fresh_process(
        f"{_GLIBC_INITIAL}; before = launch_workers.page_faults_per_step(0); "
        "kept = autopar.runtime.keep_freed_memory(); "
        "after = launch_workers.page_faults_per_step(0); "
        "print(json.dumps([kept, before, after]))")
    assert kept is True
    # Medians: a kept heap still grows now and then (a page, or a tensor's worth once),
    # while the initial thresholds map every tensor of over 128 KiB afresh (~20 MB a step).
    assert statistics.median(before[WARM_UP_STEPS:]) > 1000
    assert statistics.median(after[WARM_UP_STEPS:]) == 0


def test_blocks_up_to_32_mib_come_from_the_heap():
    before, after = _in_fresh_process(
        "before = launch_workers.mapped_bytes_of_new_tensor(0); "
        "autopar.runtime.keep_freed_memory(); "
        "print(json.dumps([before, launch_workers.mapped_bytes_of_new_tensor(0)]))")
    assert before >= 30 << 20
    assert after == 0


def test_launched_ranks_keep_their_memory():
    assert launch(launch_workers.mapped_bytes_of_new_tensor, 2) == [0, 0]
