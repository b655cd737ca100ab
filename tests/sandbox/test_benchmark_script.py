"""`python benchmarks/sandbox.py`, the way a user measures the code environment on their machine:
the smallest table (the fresh-interpreter baseline, the pool and the HTTP service) runs whole and
every call comes back right."""

from __future__ import annotations

import json
import subprocess
import sys

from ..conftest import ROOT


def test_the_sandbox_benchmark_runs_its_modes_and_every_call_is_correct(tmp_path):
    out = tmp_path / "bench.json"
    args = ["--quick", "--modes", "baseline,pool,http", "--workloads", "trivial", "--concurrency", "2"]
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "sandbox.py"),
        *args,
        "--workers",
        "1",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cells = json.loads(out.read_text())["cells"]
    assert [c["mode"] for c in cells] == ["baseline", "pool", "http"]
    for c in cells:
        assert c["calls"] > 0 and c["correct"] == c["calls"], c
        assert c["statuses"] == {"ok": c["calls"]}
    assert "× baseline" in proc.stdout
