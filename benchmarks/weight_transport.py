"""Weights over HTTP against the folder road (issue 34): the seconds of one sync, the trainer's write
included, when a served engine reads the folder the trainer wrote (a shared filesystem) and when it
first mirrors it from the trainer's weight service (``rstar2/weight_transfer.py``), on loopback.

    python benchmarks/weight_transport.py MODEL_DIR [--rank 8] [--repeat 5] [--json out.json]

Two servers of each kind on ``MODEL_DIR`` (`rstar2 serve`; `rstar2 vllm` where vLLM is installed):
one reads the folder the trainer writes (the folder road); the other runs in a mount namespace of
its own whose run folder is another folder of the same disk (an engine node's own disk), and
mirrors each folder from the weight service first (the HTTP road). Each sync is what the trainer
does after an update (``write_parts``, then the engine's ``load_weights``): the whole model, and a
rank-``--rank`` adapter alone (after its base once, not timed: a run's first sync). The roads
alternate. Median seconds of ``--repeat``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from rstar2.adapters import attach
from rstar2.auth import KEY_ENV
from rstar2.config import EngineSection, LoraSection
from rstar2.engines.base import WeightUpdate
from rstar2.engines.kinds import connect
from rstar2.local_service import free_port, wait_healthy
from rstar2.rl.run.distributed import LOCAL, full_state_dict
from rstar2.rl.run.sync import write_parts

ROADS = ("folder", "http")


def apart(root: Path, disk: Path) -> list[str]:
    """A server in a mount namespace of its own whose ``root`` is another folder (``disk``): an
    engine node's own disk, as without a shared filesystem."""
    disk.mkdir(parents=True, exist_ok=True)
    hide = f'mount --bind "{disk}" "{root}" && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", hide, "-"]


def start(args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([*args, "--port", str(port)], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, 900)
    return proc, url


async def syncs(
    urls: dict[str, str], weights: str, models: dict[str, torch.nn.Module], root: Path, repeat: int
) -> dict:
    engines = {
        "folder": await connect(urls["folder"]),
        "http": await connect(urls["http"], EngineSection(weights_url=weights)),
    }
    seconds: dict[str, list[float]] = {f"{kind}_{road}": [] for kind in models for road in ROADS}
    sizes: dict[str, int] = {}
    version = 0

    async def sync(kind: str, road: str, whole: bool) -> float:
        nonlocal version
        version += 1
        start = time.perf_counter()
        model = models[kind]
        for part, _ in write_parts(model, root / kind, full_state_dict(model, LOCAL), whole=whole):
            await engines[road].load_weights(WeightUpdate(version, folder=part))
        return time.perf_counter() - start

    try:
        for _ in range(repeat):
            for kind in models:
                for road in ROADS:
                    if kind == "adapter":  # its base first (a run's first sync), then the adapter alone
                        await sync(kind, road, whole=True)
                    seconds[f"{kind}_{road}"].append(await sync(kind, road, whole=False))
        for kind in models:
            sizes[kind] = sum(f.stat().st_size for f in (root / kind).glob("*.safetensors"))
    finally:
        for e in engines.values():
            await e.close()
    return {
        **{k: statistics.median(v) for k, v in seconds.items()},
        **{f"{k}_bytes": v for k, v in sizes.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    from rstar2.engines.vllm_launch import installed

    os.environ[KEY_ENV] = secrets.token_hex(16)  # as a launch runs them: every service with the key
    models = {
        "whole": AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32),
        "adapter": attach(
            AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32),
            LoraSection(rank=args.rank),
            args.model,
        ),
    }
    rows = {}
    with (
        tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp,
        tempfile.TemporaryDirectory(dir=Path.cwd()) as other,
    ):
        root, disk = Path(tmp), Path(other)
        weights, weights_url = start(
            [sys.executable, "-m", "rstar2.weight_transfer", "--root", str(root)], root / "weights.log"
        )
        rstar2 = [sys.executable, "-m", "rstar2"]
        servers = {"rstar2 serve": [*rstar2, "serve", "--model", str(args.model), "--device", "cpu"]}
        if installed():
            vllm = [*rstar2, "vllm", "--model", str(args.model), "--dtype", "float32", "--eager"]
            servers["vLLM-CPU"] = [*vllm, "--kv-cache-gib", "1", "--lora-rank", str(args.rank)]
        try:
            for name, cmd in servers.items():
                cmd = [*cmd, "--weights-from", str(root)]
                short = name.split()[0]
                procs, urls = {}, {}
                procs["folder"], urls["folder"] = start(cmd, root / f"{short}-folder.log")
                http = [*apart(root, disk / short), *cmd, "--fetch-from", weights_url]
                procs["http"], urls["http"] = start(http, disk / f"{short}-http.log")
                try:
                    rows[name] = asyncio.run(syncs(urls, weights_url, models, root / short, args.repeat))
                finally:
                    for proc in procs.values():
                        proc.terminate()
                        proc.wait(60)
        finally:
            weights.terminate()
            weights.wait(30)
    cpu = torch.backends.cpu.get_cpu_capability()
    print(
        f"\nOne sync of {args.model} (write + load), folder road against HTTP; CPU {cpu}, median of {args.repeat}\n"
    )
    print("| engine | weights | MiB | folder s | HTTP s | HTTP / folder |")
    print("|---|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        for kind, label in (("whole", "whole model"), ("adapter", f"rank-{args.rank} adapter")):
            folder, http = r[f"{kind}_folder"], r[f"{kind}_http"]
            print(
                f"| {name} | {label} | {r[f'{kind}_bytes'] / 2**20:.1f} | {folder:.3f} | {http:.3f} | {http / folder:.2f}x |"
            )
    if args.json:
        args.json.write_text(
            json.dumps({"cpu": cpu, "model": str(args.model), "rank": args.rank, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
