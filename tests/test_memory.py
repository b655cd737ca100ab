"""``rstar2.memory``: freed blocks that glibc keeps in the heap go back to the OS when trimmed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rstar2.memory import KERNEL_CACHES

# In a fresh process: free one 16 MB block (glibc then serves blocks under 16 MB from the heap, as it
# does in a trainer after its first update), fill 320 MB of 8 MB blocks, keep a small block above
# them so the heap's top cannot shrink, free the 8 MB blocks, and read the resident size before and
# after ``trim_heap``.
SCRIPT = """
import json, sys, torch
from rstar2.memory import trim_heap
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
big = torch.ones(16 << 20, dtype=torch.uint8); del big
blocks = [torch.ones(8 << 20, dtype=torch.uint8) for _ in range(40)]
pin = torch.ones(1 << 20, dtype=torch.uint8)
del blocks
before = rss()
trimmed = trim_heap() if sys.argv[1] == "trim" else None
print(json.dumps({"before": before, "after": rss(), "trimmed": trimmed}))
"""


def _run(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_trim_heap_returns_freed_heap_to_the_os():
    kept = _run("none")
    assert kept["before"] - kept["after"] < 64 << 20  # without a trim the freed 320 MB stay resident
    assert kept["after"] > 300 << 20
    trimmed = _run("trim")
    assert trimmed["trimmed"] is True
    assert trimmed["before"] - trimmed["after"] > 256 << 20


def test_a_micro_batch_too_large_for_the_memory_is_lowered_to_a_power_of_two_that_fits():
    from rstar2.memory import LOGIT_COPIES, fit_micro_batch

    gib = 2**30
    # SmolLM2's vocabulary with 23 GiB free: 16,384 tokens would hold 24 GiB of logits
    fitted = fit_micro_batch(16384, 49152, 23 * gib)
    assert fitted == 4096 and fitted * 49152 * 4 * LOGIT_COPIES <= 0.5 * 23 * gib < 2 * fitted * 49152 * 32
    assert fit_micro_batch(16384, 512, 23 * gib) == 16384  # the tiny model's 512 tokens: as asked
    assert fit_micro_batch(3000, 49152, 2 * gib) == 512  # the power of two below, halved until it fits
    assert fit_micro_batch(16384, 152064, 1) == 256  # never below 256
    assert fit_micro_batch(16384, 49152, None) == 16384  # memory unknown: as asked


def test_training_lowers_the_micro_batch_where_memory_is_short_and_says_so(tmp_path, capsys, monkeypatch):
    from rstar2.config_files import parse_config
    from rstar2.rl.run import launch
    from rstar2.rl.run.distributed import LOCAL

    cfg = parse_config(
        {"kind": "sft", "model": {"path": "x"}, "data": {"train": "x"}, "run": {"out": str(tmp_path)}}
    )
    monkeypatch.setattr("rstar2.memory.available_bytes", lambda device="cpu": 4 * 2**30)
    fitted = launch.fit_to_memory(cfg, 49152, LOCAL)
    assert fitted.optim.micro_batch_tokens == 1024  # 1024 x 49152 x 32 B = 1.5 GiB, within half of 4 GiB
    assert cfg.optim.micro_batch_tokens == 16384  # the config asked for stays as written
    assert "optim.micro_batch_tokens 16384 would hold ~24 GiB" in capsys.readouterr().out
    assert launch.fit_to_memory(fitted, 49152, LOCAL) is fitted  # fitted already: nothing said
    assert not capsys.readouterr().out


def test_resident_gib_follows_an_allocation_and_keeps_its_peak():
    """Each training step logs ``memory/rss_gib`` and ``memory/peak_gib``: 256 MB touched raise both,
    and once freed (and trimmed) the current size falls while the peak stays."""
    script = """
import json, torch
from rstar2.memory import reset_peak, resident_gib, trim_heap
reset_peak()
start = resident_gib()
block = torch.ones(256 << 20, dtype=torch.uint8)
held = resident_gib()
del block
trim_heap()
print(json.dumps([start, held, resident_gib()]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    start, held, freed = json.loads(out.stdout)
    gib = 256 / 1024
    assert held["memory/rss_gib"] - start["memory/rss_gib"] > 0.9 * gib
    assert (
        held["memory/peak_gib"] >= held["memory/rss_gib"]
        and held["memory/peak_gib"] - start["memory/peak_gib"] > 0.9 * gib
    )
    assert held["memory/rss_gib"] - freed["memory/rss_gib"] > 0.9 * gib  # handed back
    assert freed["memory/peak_gib"] >= held["memory/peak_gib"] - 1e-3  # the peak is kept


def test_importing_rstar2_caps_the_kernel_caches_unless_the_caller_set_them():
    """oneDNN and ideep read their cache sizes once, at their first kernel: importing rstar2 sets them
    (a fresh interpreter, as every rstar2 process starts), and a size the user chose stays."""
    show = "import os, rstar2; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], os.environ['LRU_CACHE_CAPACITY'])"
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_CACHES}
    ours = subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True, check=True)
    assert ours.stdout.split() == [
        KERNEL_CACHES["ONEDNN_PRIMITIVE_CACHE_CAPACITY"],
        KERNEL_CACHES["LRU_CACHE_CAPACITY"],
    ]
    theirs = subprocess.run(
        [sys.executable, "-c", show],
        env={**env, "LRU_CACHE_CAPACITY": "7"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert theirs.stdout.split() == [KERNEL_CACHES["ONEDNN_PRIMITIVE_CACHE_CAPACITY"], "7"]
