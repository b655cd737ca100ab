"""Resident memory and speed of SFT steps with oneDNN's and ideep's kernel caches at their default
size (1024 kernels each) and at rstar2's (``rstar2.memory.KERNEL_CACHES``), each in a fresh process.

    python benchmarks/kernel_caches.py runs/trim-bf16/01-sft/config.yaml --steps 14

The config is any SFT stage a recipe wrote (its model and demonstrations); each arm runs ``rstar2
train`` on it for ``--steps`` steps into a scratch folder and reads the per-step ``memory/rss_gib``
(after the step, the heap trimmed), ``memory/peak_gib`` and ``time/step_s``. Micro-batches of varying
length meet new matrix shapes at every step: with the caches unbounded the resident memory after each
step climbs; bounded it stays flat. The baseline is the default arm, run first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from rstar2.memory import KERNEL_CACHES

ARMS = {"default (1024 each)": {k: "1024" for k in KERNEL_CACHES}, "rstar2": KERNEL_CACHES}


def run_arm(config: Path, steps: int, env: dict[str, str], out: Path) -> list[dict]:
    """``rstar2 train`` for ``steps`` steps under ``env``; its metrics, one dict a step."""
    cmd = [sys.executable, "-m", "rstar2", "train", str(config), "--out", str(out), "--no-progress"]
    cmd += ["--set", f"run.steps={steps}", "--set", "run.save_every=100000"]
    done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"rstar2 train failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path, help="an SFT stage's config.yaml (a recipe run's 01-sft)")
    ap.add_argument("--steps", type=int, default=14)
    args = ap.parse_args(argv)
    print(f"CPU capability: {torch.backends.cpu.get_cpu_capability()}; {args.steps} SFT steps an arm\n")
    print("| kernel caches | rss after step 1 (GiB) | rss after last (GiB) | peak (GiB) | s a step |")
    print("| --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as scratch:
        for n, (name, env) in enumerate(ARMS.items()):
            rows = run_arm(args.config, args.steps, env, Path(scratch) / f"arm{n}")
            rss, peak = [r["memory/rss_gib"] for r in rows], max(r["memory/peak_gib"] for r in rows)
            seconds = sum(r["time/step_s"] for r in rows) / len(rows)
            print(f"| {name} | {rss[0]:.2f} | {rss[-1]:.2f} | {peak:.2f} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
