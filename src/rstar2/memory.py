"""A long run's memory kept from growing. Freed memory goes back to the operating system between a
run's phases: glibc raises its mmap threshold as large blocks are freed, so the update's buffers and
the rollouts' KV come from the heap and stay there, the next phase's peak on top of the last one's;
``malloc_trim`` hands the free pages back in milliseconds. And the kernel caches under torch are
bounded (``KERNEL_CACHES``). Also here: peak and free memory, and the micro-batch that fits."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
from functools import cache

# oneDNN and ideep (PyTorch's layer over it) keep a compiled kernel and its scratch buffers for every
# shape they meet, 1024 of each by default: micro-batches of varying length grew the resident memory at
# every step under bf16; 64 keep a pass's shapes, at the same speed (benchmarks/kernel_caches.py).
KERNEL_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def bound_kernel_caches() -> None:
    """Cap oneDNN's and ideep's kernel caches (``KERNEL_CACHES``) unless the caller set them; both
    read the variable once, at their first kernel, so this runs when rstar2 is imported."""
    for name, capacity in KERNEL_CACHES.items():
        os.environ.setdefault(name, capacity)


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
    if (libc := _libc()) is None:
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


def _proc_bytes(path: str, key: str) -> int | None:
    """A ``key: N kB`` line of a /proc file, in bytes; None where it cannot be read."""
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return None


def peak_bytes() -> int:
    """This process's peak resident memory since the last ``reset_peak`` (or since it began)."""
    if (peak := _proc_bytes("/proc/self/status", "VmHWM:")) is not None:
        return peak
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def resident_gib() -> dict[str, float]:
    """This process's resident memory now and its peak, in GiB: logged with every training step, so
    a long run's metrics show where its peak was reached (a recipe's stages share one process)."""
    out = {"memory/peak_gib": peak_bytes() / 2**30}
    if (rss := _proc_bytes("/proc/self/status", "VmRSS:")) is not None:
        out["memory/rss_gib"] = rss / 2**30
    return out


# fp32 copies of a micro-batch's logits alive at the update's peak (logits, log-softmax,
# probabilities for the entropy, and their gradients)
LOGIT_COPIES = 8


def available_bytes(device: str = "cpu") -> int | None:
    """Memory free on ``device`` (Linux ``MemAvailable``; a GPU's free memory); None if unknown."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    return _proc_bytes("/proc/meminfo", "MemAvailable:")


def fit_micro_batch(tokens: int, vocab: int, available: int | None, share: float = 0.5) -> int:
    """The largest micro-batch, ``tokens`` or a power of two below it, whose logits (``LOGIT_COPIES``
    fp32 copies over the vocabulary) fit ``share`` of the ``available`` memory (at least 256)."""
    if available is None:
        return tokens
    fitted = tokens
    while fitted > 256 and fitted * vocab * 4 * LOGIT_COPIES > share * available:
        fitted = 1 << ((fitted - 1).bit_length() - 1)  # the power of two below
    return fitted
