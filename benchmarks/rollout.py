"""Rollout throughput on the tiny model (CPU by default, CUDA with --device cuda).

1. Generated tokens/s of HFEngine serving N concurrent requests vs N sequential
   `model.generate` calls (the baseline), same model, same lengths, same run.
2. A multi-turn rollout batch whose turns do real generation and real tool calls (each turn
   generates with the engine, then calls the sandbox): the share of wall time the engine is idle
   while trajectories wait on tools, and the tool time per trajectory.

    python benchmarks/rollout.py [--requests 32] [--new-tokens 64] [--device cpu] [--out results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import torch

from rstar2.chat.format import ChatFormat
from rstar2.chat.tools import PYTHON_TOOL
from rstar2.config import RolloutSection
from rstar2.engines.base import Generation, SamplingParams
from rstar2.engines.hf import HFEngine
from rstar2.recipe.tiny_model import build_model, build_tokenizer
from rstar2.rollout import Rollout
from rstar2.sandbox import LocalPool


def tiny(device: str, hidden: int, layers: int):
    from rstar2.chat.prompt import SYSTEM_PROMPT

    tok = build_tokenizer([SYSTEM_PROMPT, "print(sum(range(10)))", "<reason> 1 + 2 = 3 </reason>"] * 50, 512)
    model = build_model(tok, hidden=hidden, layers=layers, heads=4, mlp=4 * hidden, max_positions=2048)
    return model.to(device).eval(), tok


def prompts(tok, n: int) -> list[list[int]]:
    return [
        tok.encode(f"<|im_start|>user\nproblem {i}: {'x ' * (i % 7)}<|im_end|>\n", add_special_tokens=False)
        for i in range(n)
    ]


@torch.no_grad()
def sequential_generate(model, ps: list[list[int]], new: int) -> float:
    start = time.perf_counter()
    for p in ps:
        ids = torch.tensor([p], device=model.device)
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=True,
            top_k=0,
            pad_token_id=0,
        )
    return time.perf_counter() - start


async def engine_generate(engine: HFEngine, ps: list[list[int]], new: int) -> float:
    start = time.perf_counter()
    params = [SamplingParams(max_new_tokens=new, temperature=1.0, seed=i) for i in range(len(ps))]
    await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(ps, params, strict=True)))
    return time.perf_counter() - start


class ToolUsingPolicy:
    """Real generation of `think` tokens per turn through the engine, then a scripted tool call
    (a random model would rarely write one): real compute on both sides of every turn."""

    def __init__(self, engine: HFEngine, fmt: ChatFormat, think: int, code: str, end_id: int) -> None:
        self.engine, self.fmt, self.think, self.end_id = engine, fmt, think, end_id
        self.call = fmt.encode(
            "<tool_call>" + json.dumps({"name": PYTHON_TOOL, "arguments": {"code": code}}) + "</tool_call>"
        )
        self.name, self.capacity_tokens = "tool-policy", 1 << 20

    @property
    def in_flight(self) -> int:
        return self.engine.in_flight

    async def generate(self, prompt_ids, params) -> Generation:
        g = await self.engine.generate(
            prompt_ids, SamplingParams(max_new_tokens=self.think, temperature=1.0, seed=params.seed)
        )
        ids = g.token_ids + self.call + [self.end_id]
        return Generation(ids, g.logprobs + [0.0] * (len(self.call) + 1), "stop")

    async def close(self) -> None:
        pass


async def rollout_batch(model, tok, n: int, think: int, turns: int, code: str) -> dict:
    fmt = ChatFormat(tok)
    engine = HFEngine(model, max_batch_size=n)
    policy = ToolUsingPolicy(engine, fmt, think, code, tok.convert_tokens_to_ids("<|im_end|>"))
    async with LocalPool() as pool:
        await pool.run("print(1)")
        rollout = Rollout(
            policy, fmt, pool, None, RolloutSection(max_turns=turns, max_response_tokens=100_000)
        )
        start = time.perf_counter()
        trajs = await rollout.run_many([{"problem": f"problem {i}", "seed": i} for i in range(n)])
        wall = time.perf_counter() - start
    await engine.close()
    return {
        "trajectories": n,
        "turns": turns,
        "wall_s": wall,
        "engine_busy_share": engine.stats["busy_s"] / wall,
        "tool_s_per_trajectory": sum(t.tool_seconds for t in trajs) / n,
        "batches": engine.stats["batches"],
        "calls_ok": sum(c.status == "ok" for t in trajs for c in t.calls),
        "calls": sum(t.num_calls for t in trajs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = tiny(args.device, args.hidden, args.layers)
    ps = prompts(tok, args.requests)
    sequential_generate(model, ps[:2], 4)  # warm-up
    seq_s = sequential_generate(model, ps, args.new_tokens)
    engine = HFEngine(model, max_batch_size=args.requests)
    asyncio.run(engine_generate(engine, ps[:2], 4))
    eng_s = asyncio.run(engine_generate(engine, ps, args.new_tokens))
    asyncio.run(engine.close())
    tokens = args.requests * args.new_tokens
    rows = [
        ("sequential model.generate (baseline)", seq_s, tokens / seq_s, 1.0),
        (f"HFEngine, {args.requests} concurrent", eng_s, tokens / eng_s, seq_s / eng_s),
    ]
    print(f"\ntiny Qwen2 ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params) on {args.device}, "
          f"{args.requests} requests x {args.new_tokens} new tokens")  # fmt: skip
    print(f"{'method':40s} {'wall s':>8s} {'tokens/s':>10s} {'vs baseline':>12s}")
    for name, s, tps, ratio in rows:
        print(f"{name:40s} {s:8.2f} {tps:10.0f} {ratio:11.1f}x")

    batch = asyncio.run(
        rollout_batch(model, tok, args.requests, 24, 3, "import sympy\nprint(sympy.factorint(2**32 + 1))")
    )
    print(f"\nrollout batch: {batch['trajectories']} trajectories x {batch['turns']} turns, each turn 24 generated "
          f"tokens + one sympy tool call")  # fmt: skip
    print(
        f"{'wall s':>8s} {'engine busy':>12s} {'engine idle':>12s} {'tool s/traj':>12s} {'batches':>8s} {'calls ok':>9s}"
    )
    print(f"{batch['wall_s']:8.2f} {batch['engine_busy_share']:11.0%} {1 - batch['engine_busy_share']:11.0%} "
          f"{batch['tool_s_per_trajectory']:12.3f} {batch['batches']:8d} {batch['calls_ok']:4d}/{batch['calls']}")  # fmt: skip
    if args.out:
        result = {
            "args": vars(args),
            "engine": [
                dict(zip(("method", "wall_s", "tokens_per_s", "ratio"), r, strict=True)) for r in rows
            ],
            "rollout_batch": batch,
        }
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
