"""What issue 26's checks cost a served engine: ``rstar2 serve`` on a model, without an API key and
with one (every request's bearer token checked), A-B-B-A in the same run; a batch of concurrent
completions as a rollout step sends them, timed through rstar2's own client (``OpenAIEngine``,
which also reads each token's version and, in training, refuses a token without one).

    python benchmarks/trust_checks.py --model /path/to/SmolLM2 [--requests 64] [--tokens 32] [--rounds 2]

Prints a table (wall seconds per batch, and the key's cost per request) and writes ``--out`` JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from rstar2.auth import KEY_ENV
from rstar2.engines.base import SamplingParams
from rstar2.engines.openai import OpenAIEngine
from rstar2.local_service import free_port, wait_healthy

KEY = "benchmark-key-0123456789abcdef"


def start(model: Path, key: str | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "rstar2",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--device",
        "cpu",
    ]
    cmd += ["--api-key", key] if key else []
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, 600, "rstar2 serve")
    return proc, url


async def batch(url: str, key: str | None, requests: int, tokens: int) -> float:
    """Wall seconds for ``requests`` concurrent completions of up to ``tokens`` tokens (greedy: the
    same tokens on both servers)."""
    engine = OpenAIEngine(url, api_key=key)
    await engine.probe_capacity()
    params = SamplingParams(max_new_tokens=tokens, temperature=0.0)
    prompts = [[5 + (i % 50), 6, 7, 8, 9] for i in range(requests)]
    await engine.generate(prompts[0], SamplingParams(max_new_tokens=2))  # connections warm
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    wall = time.perf_counter() - t0
    assert all(g.versions is not None and len(g.versions) == len(g.token_ids) for g in gens)
    await engine.close()
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="A-B-B-A rounds")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    servers = {name: start(a.model, key) for name, key in (("open", None), ("key", KEY))}
    times: dict[str, list[float]] = {"open": [], "key": []}
    try:
        for _ in range(a.rounds):
            for name in ("open", "key", "key", "open"):
                key = KEY if name == "key" else None
                times[name].append(asyncio.run(batch(servers[name][1], key, a.requests, a.tokens)))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
    capability = torch.backends.cpu.get_cpu_capability()
    rows = {name: {"median_s": statistics.median(t), "all_s": t} for name, t in times.items()}
    cost = (rows["key"]["median_s"] - rows["open"]["median_s"]) / a.requests
    print(f"CPU capability {capability}; {a.requests} concurrent completions of {a.tokens} tokens, {a.model}")
    print("| server | batch wall s (median) | all |")
    print("|---|---:|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['median_s']:.3f} | {', '.join(f'{x:.3f}' for x in r['all_s'])} |")
    print(f"the key's cost: {1000 * cost:+.2f} ms a request (median against median)")
    if a.out:
        a.out.write_text(
            json.dumps(
                {
                    "cpu": capability,
                    "args": vars(a) | {"model": str(a.model), "out": str(a.out)},
                    "rows": rows,
                    "key_cost_ms_per_request": 1000 * cost,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
