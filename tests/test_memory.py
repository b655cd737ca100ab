"""``rstar2.memory``: freed blocks that glibc keeps in the heap go back to the OS when trimmed."""

from __future__ import annotations

import json
import subprocess
import sys

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
