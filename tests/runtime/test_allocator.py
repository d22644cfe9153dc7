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


def _faults_in_fresh_process(keep: bool) -> list[int]:
    code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            "import autopar, launch_workers, torch; torch.set_num_threads(1); "
            f"kept = autopar.runtime.keep_freed_memory() if {keep} else None; "
            "print(json.dumps([kept, launch_workers.page_faults_per_step(0)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    kept, faults = json.loads(out.splitlines()[-1])
    assert kept in (None, True)
    return faults[WARM_UP_STEPS:]


def test_glibc_malloc_is_what_this_machine_runs():
    # Everything below assumes glibc (keep_freed_memory is a no-op elsewhere).
    assert platform.libc_ver()[0] == "glibc"


# Medians: a kept heap still grows now and then (a page, or a tensor's worth once), while
# glibc's defaults fault thousands of pages (up to ~25 MB) in most steps.
def test_steps_fault_no_pages_once_memory_is_kept():
    assert statistics.median(_faults_in_fresh_process(keep=False)) > 256
    assert statistics.median(_faults_in_fresh_process(keep=True)) == 0


def test_launched_ranks_keep_their_memory():
    for faults in launch(launch_workers.page_faults_per_step, 2):
        assert statistics.median(faults[WARM_UP_STEPS:]) == 0
