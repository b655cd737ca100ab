"""Rollout scheduling policies compared in the discrete-event simulator (``scheduler_model.py``),
on the same heavy-tailed multi-turn workloads and seeds: ``static`` (equal split, a barrier per
turn: the baseline of the paper), ``least_requests`` (verl's dispatch) and ``kv`` (rstar2's).

Engine costs come from two sources, both printed:
- ``measured``: an affine fit of a real ``HFEngine`` on this machine (the tiny model): decode
  iteration time against batch size, and prefill time per token;
- ``gpu-14b``: a stated assumption for a 14B model on one H100 (weights read per iteration
  ~12 ms, ~0.3 ms per sequence of KV read, ~70 µs per prefilled token), since no GPU is measured here.
Tool latencies are log-normal through the median and p99 of the sandbox benchmark's results file.

    python benchmarks/scheduler_sim.py [--seeds 3] [--trajectories 256] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from scheduler_model import Cost, ToolLatency, simulate, workload

from rstar2.rollout.scheduler import make_policy

POLICIES = ("static", "least_requests", "kv")
GPU_14B = Cost(base_s=0.012, per_seq_s=0.0003, per_prefill_token_s=0.00007)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def measure_hf_cost(repeats: int = 3) -> tuple[Cost, dict]:
    """Decode-iteration time vs batch size and prefill time per token of a real HFEngine batch."""
    import asyncio

    import torch

    from rstar2.engines.base import SamplingParams
    from rstar2.engines.hf import HFEngine
    from rstar2.recipe.tiny_model import build_model, build_tokenizer

    torch.manual_seed(0)
    tok = build_tokenizer(["print(sum(range(10)))", "The answer is 42."] * 50, 512)
    model = build_model(tok, hidden=128, layers=4, heads=4, mlp=512, max_positions=2048).eval()

    async def batch_of(batch: int, prompt: int, new: int) -> None:
        # prompts that share no prefix and no kept cache: every one is prefilled whole
        engine = HFEngine(model, max_batch_size=batch, keep_tokens=0)
        params = [SamplingParams(max_new_tokens=new, temperature=1.0, seed=i) for i in range(batch)]
        prompts = [[5 + i] + [5] * (prompt - 1) for i in range(batch)]
        await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True)))
        await engine.close()

    def run(batch: int, prompt: int, new: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            asyncio.run(batch_of(batch, prompt, new))
            best = min(best, time.perf_counter() - start)
        return best

    batches = [1, 4, 16, 32]
    step = [(run(b, 16, 33) - run(b, 16, 1)) / 32 for b in batches]  # prefill cancels out
    base, per_seq = fit_line([float(b) for b in batches], step)
    lengths = [64, 256, 512]
    prefill = [run(1, n, 1) for n in lengths]
    _, per_token = fit_line([float(n) for n in lengths], prefill)
    cost = Cost(base_s=max(base, 1e-6), per_seq_s=max(per_seq, 0.0), per_prefill_token_s=max(per_token, 0.0))
    raw = {"batches": batches, "step_s": step, "prompt_lengths": lengths, "prefill_s": prefill}
    return cost, raw


def tool_latency(path: Path) -> ToolLatency:
    try:
        cells = json.loads(path.read_text())["cells"]
        cell = next(
            c for c in cells if c["mode"] == "pool" and c["workload"] == "sympy" and c["in_flight"] == 1
        )
        return ToolLatency(cell["p50_ms"] / 1000, cell["p99_ms"] / 1000)
    except (OSError, KeyError, StopIteration, ValueError):
        return ToolLatency(0.3, 3.0)  # the paper's mean latency, with a long tail


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--trajectories", type=int, default=256, help="per batch (groups of 16 per problem)")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--no-measure", action="store_true", help="skip the HFEngine cost fit (GPU preset only)")
    ap.add_argument(
        "--sandbox-results",
        type=Path,
        default=Path(__file__).with_name("results-sandbox-2026-11-21.json"),
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    costs = {"gpu-14b": GPU_14B}
    report: dict = {"costs": {}, "rows": []}
    if not args.no_measure:
        measured, raw = measure_hf_cost()
        costs["measured"] = measured
        report["hf_measurement"] = raw
    tool = tool_latency(args.sandbox_results)
    report["tool_latency"] = tool.__dict__
    print(f"tool latency: log-normal, median {tool.median_s * 1000:.1f} ms, p99 {tool.p99_s * 1000:.0f} ms")
    for name, c in costs.items():
        report["costs"][name] = c.__dict__
        print(
            f"cost {name}: iteration = {c.base_s * 1000:.2f} ms + {c.per_seq_s * 1000:.3f} ms × batch"
            f" + {c.per_prefill_token_s * 1e6:.2f} µs × prefilled tokens"
        )
    e = args.engines
    scenarios = {
        "uniform engines (64K tokens each)": [65536] * e,
        "mixed engines (128K/32K tokens)": [131072] * (e // 2) + [32768] * (e - e // 2),
    }
    print()
    header = "| cost | engines | policy | makespan s | tokens/s | × static | × least_req | busy | evictions | recomputed tok | wait mean s | wait p95 s |"
    print(header)
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cname, cost in costs.items():
        for sname, caps in scenarios.items():
            per: dict[str, list] = {p: [] for p in POLICIES}
            for seed in range(args.seeds):
                shapes = workload(
                    args.trajectories,
                    seed=seed,
                    group=16,
                    median_turn_tokens=700,
                    turn_tokens_sigma=1.0,
                    tool=tool,
                )
                for p in POLICIES:
                    per[p].append(simulate(shapes, make_policy(p, caps), cost=cost))
            for p in POLICIES:
                runs = per[p]
                ratio_static = [
                    r.tokens_per_s / s.tokens_per_s for r, s in zip(runs, per["static"], strict=True)
                ]
                ratio_lr = [
                    r.tokens_per_s / s.tokens_per_s for r, s in zip(runs, per["least_requests"], strict=True)
                ]
                row = {
                    "cost": cname,
                    "engines": sname,
                    "policy": p,
                    "makespan_s": statistics.fmean(r.makespan_s for r in runs),
                    "tokens_per_s": statistics.fmean(r.tokens_per_s for r in runs),
                    "x_static": statistics.fmean(ratio_static),
                    "x_static_min": min(ratio_static),
                    "x_least_requests": statistics.fmean(ratio_lr),
                    "x_least_requests_min": min(ratio_lr),
                    "busy_share": statistics.fmean(r.busy_share for r in runs),
                    "evictions": sum(r.evictions for r in runs),
                    "recomputed_tokens": sum(r.recomputed_tokens for r in runs),
                    "wait_mean_s": statistics.fmean(r.wait_mean_s for r in runs),
                    "wait_p95_s": statistics.fmean(r.wait_p95_s for r in runs),
                    "finished": sum(r.finished for r in runs),
                    "runs": [r.row() for r in runs],
                }
                report["rows"].append(row)
                print(
                    f"| {cname} | {sname} | {p} | {row['makespan_s']:.1f} | {row['tokens_per_s']:.0f} | "
                    f"{row['x_static']:.2f}× (min {row['x_static_min']:.2f}) | "
                    f"{row['x_least_requests']:.2f}× (min {row['x_least_requests_min']:.2f}) | "
                    f"{row['busy_share']:.0%} | {row['evictions']} | {row['recomputed_tokens']:,} | "
                    f"{row['wait_mean_s']:.2f} | {row['wait_p95_s']:.2f} |"
                )
    print(
        f"\n{args.seeds} seeds × {args.trajectories} trajectories per batch (16 per problem); means over seeds;"
    )
    print("evictions and recomputed tokens summed over seeds.")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
        print(f"raw numbers: {args.out}")


if __name__ == "__main__":
    main()
