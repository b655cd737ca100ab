"""Giving freed memory back to the operating system between the phases of a run.

glibc raises its mmap threshold each time a large block is freed, so after the first RL update the
update's buffers (49K-wide logits, activations) and the rollouts' KV come from the heap and stay
there when freed: the next phase's peak lands on top of the last one's (SmolLM2, rl-hard: 7.0 GiB
after three steps instead of 5.4). ``malloc_trim`` hands the free pages back in milliseconds.
"""

from __future__ import annotations

import ctypes
import gc
from functools import cache


@cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - raises AttributeError off glibc
        return libc
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


def trim_heap() -> bool:
    """Return the heap's free pages to the OS; whether this C library can (glibc only)."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def release_memory() -> None:
    """Collect unreachable objects, then trim: between a recipe's stages and evaluations, where the
    last trainer's optimizer state and engine are garbage."""
    gc.collect()
    trim_heap()


def reset_peak() -> bool:
    """Start measuring this process's peak resident memory afresh (Linux: ``clear_refs``); whether
    it could (elsewhere ``peak_bytes`` keeps the peak since the process began)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    """This process's peak resident memory since the last ``reset_peak`` (or since it began)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux
