"""The scheduling policies on real servers: N ``rstar2 serve`` replicas of a model (separate
processes, real HTTP), the real sandbox and verifier, one rollout batch per policy in the same run.
Reports wall time, generated tokens/s, and each server's idle share (1 − its generating time / wall).

    python benchmarks/scheduler_real.py [--model DIR] [--servers 2] [--trajectories 48] [--out results.json]

Without ``--model`` it builds the untrained tiny model here: its turns end at a random stop token (a
heavy-tailed length) and it rarely writes a parseable tool call, so that batch exercises uneven
turns more than tool waits; pass a trained checkpoint (``runs/tiny/...``) for multi-turn trajectories.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from rstar2.chat.format import ChatFormat
from rstar2.config import RolloutSection, SchedulerSection
from rstar2.engines.openai import OpenAIEngine
from rstar2.local_service import free_port, wait_healthy
from rstar2.reward import VerifierPool
from rstar2.rollout import Rollout
from rstar2.sandbox import LocalPool

POLICIES = ("static", "least_requests", "kv")


def tiny_model(out: Path) -> Path:
    from rstar2.chat.prompt import SYSTEM_PROMPT
    from rstar2.recipe.tiny_model import build_model, build_tokenizer, save_pretrained

    tok = build_tokenizer([SYSTEM_PROMPT, "print(sum(range(10)))", "<answer> 42 </answer>"] * 50, 512)
    model = build_model(tok, hidden=128, layers=4, heads=4, mlp=512, max_positions=1024)
    return save_pretrained(model, tok, out)


def start_servers(model: Path, n: int, capacity: int) -> tuple[list[subprocess.Popen], list[str]]:
    procs, urls = [], []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(n):
        port = free_port()
        cmd = [sys.executable, "-m", "rstar2", "serve", "--model", str(model), "--port", str(port)]
        cmd += ["--device", "cpu", "--max-batch-size", "64", "--capacity-tokens", str(capacity)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        urls.append(f"http://127.0.0.1:{port}")
    for proc, url in zip(procs, urls, strict=True):
        wait_healthy(url, proc, 600, "rstar2 serve")
    return procs, urls


def busy(urls: list[str]) -> list[float]:
    return [httpx.get(u + "/health", timeout=30).json()["busy_s"] for u in urls]


async def one_batch(policy: str, urls: list[str], fmt, pool, verifier, n: int, max_tokens: int) -> dict:
    engines = [OpenAIEngine(u, name=f"server{i}") for i, u in enumerate(urls)]
    for e in engines:
        await e.probe_capacity()
    cfg = RolloutSection(
        max_turns=4,
        max_response_tokens=max_tokens,
        temperature=1.0,
        scheduler=SchedulerSection(policy=policy),
    )
    rollout = Rollout(engines, fmt, pool, verifier, cfg)
    items = [
        {"problem": f"Compute {17 * i + 3} * {29 + i}.", "answer": str((17 * i + 3) * (29 + i)), "seed": i}
        for i in range(n)
    ]
    before = busy(urls)
    start = time.perf_counter()
    trajs = await rollout.run_many(items)
    wall = time.perf_counter() - start
    after = busy(urls)
    for e in engines:
        await e.close()
    tokens = sum(sum(m for m in t.loss_mask) for t in trajs)
    return {
        "policy": policy,
        "wall_s": wall,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "idle_share": [max(0.0, 1 - (a - b) / wall) for a, b in zip(after, before, strict=True)],
        "turns": sum(len(t.turns) for t in trajs),
        "tool_calls": sum(len(t.calls) for t in trajs),
        "finish": {r: sum(t.finish_reason == r for t in trajs) for r in {t.finish_reason for t in trajs}},
    }


async def run(args) -> dict:
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or tiny_model(Path(tmp) / "tiny")
        procs, urls = start_servers(Path(model), args.servers, args.capacity_tokens)
        pool = LocalPool(workers=1)
        await pool.start()
        verifier = VerifierPool(1).start()
        try:
            fmt = ChatFormat(AutoTokenizer.from_pretrained(str(model)))
            await one_batch("least_requests", urls, fmt, pool, verifier, 8, args.max_tokens)  # warm-up
            rows = []
            for rep in range(args.repeats):  # the order alternates, so warming up favours no policy
                for policy in POLICIES if rep % 2 == 0 else POLICIES[::-1]:
                    r = await one_batch(policy, urls, fmt, pool, verifier, args.trajectories, args.max_tokens)
                    r["repeat"] = rep
                    rows.append(r)
                    print(
                        f"| {rep} | {policy} | {r['wall_s']:.1f} | {r['tokens_per_s']:.1f} | "
                        f"{' / '.join(f'{x:.0%}' for x in r['idle_share'])} | {r['turns']} | {r['tool_calls']} |",
                        flush=True,
                    )
            print("\n| policy | tokens/s (mean) | × static |\n|---|---:|---:|")
            mean = {
                p: sum(r["tokens_per_s"] for r in rows if r["policy"] == p) / args.repeats for p in POLICIES
            }
            for p in POLICIES:
                print(f"| {p} | {mean[p]:.1f} | {mean[p] / mean['static']:.2f}× |")
            return {
                "servers": args.servers,
                "capacity_tokens": args.capacity_tokens,
                "rows": rows,
                "mean": mean,
            }
        finally:
            verifier.close()
            await pool.close()
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--trajectories", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=192, help="max response tokens per trajectory")
    ap.add_argument("--capacity-tokens", type=int, default=4096, help="KV tokens each server reports")
    ap.add_argument("--repeats", type=int, default=2, help="batches per policy (order alternates)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    print("| repeat | policy | wall s | tokens/s | idle share per server | turns | tool calls |")
    print("|---|---|---:|---:|---|---:|---:|")
    report = asyncio.run(run(args))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
        print(f"raw numbers: {args.out}")


if __name__ == "__main__":
    main()
