"""CPU processes that keep the memory they free: `keep_freed_memory`.

A training step frees and allocates the same activations, gradients and buckets, megabytes
each, every time. By default glibc's malloc hands large freed blocks back to the kernel (a
block above its mmap threshold is a mapping of its own; free space at the top of the heap
beyond its trim threshold is trimmed), so the next step takes them back page by page, each
page zero-filled by the kernel on first touch. glibc adapts both thresholds to the blocks
freed so far, so how often that happens depends on the process's history: an MLP step
(512 -> 2048 -> 512, batch 64, one thread) faulted in about 5,000 pages (20 MB) on most
steps in one interpreter and took 58 ms; with the thresholds below it faults in none after
the first step and takes 32-36 ms. jemalloc or tcmalloc preloaded would do the same
(PyTorch's CPU performance guide suggests them); this needs no preload. CUDA tensors use
torch's caching allocator and are not concerned.

Contract: `keep_freed_memory()` changes only this process's malloc: blocks up to 32 MiB come
from the heap and return to it, and free heap beyond 256 MiB is still given back, so a
process holds at most that much more than it uses at its peak. It returns False, changing
nothing, where the C library is not glibc.
"""

from __future__ import annotations

import ctypes

# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# The largest mmap threshold glibc accepts on 64-bit systems (HEAP_MAX_SIZE / 2).
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 256 << 20


def keep_freed_memory() -> bool:
    """Make this process's malloc keep freed blocks for reuse (see the module docstring);
    whether it applied. Setting the thresholds also stops glibc from adapting them."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
            and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
