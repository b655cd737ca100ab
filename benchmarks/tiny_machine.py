"""Is this machine fast enough for the demo? The unit costs of the tiny recipe, measured here.

The demo's time is the SFT data build (real tool runs), the SFT steps and the RL steps. This times
the first two on the demo's own model and code environment, next to a fixed 1-thread matmul as the
machine's baseline, and prints wall time next to CPU time: where wall ≫ CPU, the process was waiting
for a CPU the machine did not give (a shared or overloaded host), not computing. The feasibility
prototype (../shared/reference/tiny-recipe-notes.md) measured an SFT step of this model at 0.67–0.69
CPU-seconds.

    python benchmarks/tiny_machine.py [--steps 8] [--calls 200] [--out results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import torch

from rstar2.config import OptimSection
from rstar2.recipe.spec import find_recipe, load_recipe
from rstar2.recipe.tiny_model import build_model, build_tokenizer, tiny_corpus
from rstar2.rl.optim import Learner, build_optimizer
from rstar2.rl.sft import sft_batch, sft_step

PROTOTYPE_SFT_STEP_S = 0.68
SYNTHETIC = "SFT step, batch {batch} x {length} tokens (s)"
PADDED = "SFT step, demo data: one padded batch (s)"
MICRO = "SFT step, demo data: micro-batches of <= 2048 tokens (s)"


def timed(fn, repeats: int) -> list[tuple[float, float]]:
    """(wall s, CPU s of this process) per call."""
    out = []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        out.append((time.perf_counter() - w, time.process_time() - c))
    return out


def row(name: str, samples: list[tuple[float, float]], unit: float = 1.0) -> dict:
    walls, cpus = [s[0] for s in samples], [s[1] for s in samples]
    return {
        "item": name,
        "n": len(samples),
        "wall_median": statistics.median(walls) * unit,
        "wall_min": min(walls) * unit,
        "wall_max": max(walls) * unit,
        "cpu_median": statistics.median(cpus) * unit,
    }


def matmul_bench(repeats: int) -> list[tuple[float, float]]:
    a, b = torch.randn(6400, 128), torch.randn(128, 512)
    out = torch.empty(6400, 512)
    return timed(lambda: torch.mm(a, b, out=out), repeats)


def demo_sft_batch(tok, recipe, n: int):
    """A batch of the demo's own SFT conversations (a quarter with a broken first call), as ids."""
    import random

    from rstar2.chat.format import ChatFormat
    from rstar2.chat.prompt import problem_messages
    from rstar2.recipe.sft_data import break_code, conversation
    from rstar2.tasks.generator import generate

    chat = recipe.chat
    fmt = ChatFormat(
        tok, system_prompt=chat.system_prompt, user_prefix=chat.user_prefix, tools_in_prompt=False
    )
    rng, examples = random.Random(5), []
    for t in generate(n, digits=(1, 3), seed=5):
        calls = [(break_code(t.code, rng), "Tool call failed: NameError")] if rng.random() < 0.25 else []
        calls.append((t.code, str(t.answer)))
        msgs = conversation(
            problem_messages(t.problem, chat.system_prompt, chat.user_prefix), calls, t.answer
        )
        examples.append(fmt.conversation_ids(msgs))
    return sft_batch(examples, tok.pad_token_id or 0)


def sft_step_bench(recipe, steps: int, batch: int, length: int) -> tuple[dict[str, list], list[int]]:
    """The real SFT step (``rl.sft.sft_step``: forward, backward, clip, AdamW) of the demo's model,
    alternated step by step over three batches: ``batch`` × ``length`` random tokens (the
    prototype's measurement), and the demo's own conversations padded to their longest row or
    cut into micro-batches of rows of similar length (``optim.micro_batch_tokens``)."""
    m = recipe.model
    tok = build_tokenizer(tiny_corpus(recipe, 600), m.vocab)
    model = build_model(
        tok, hidden=m.hidden, layers=m.layers, heads=m.heads, mlp=m.mlp, max_positions=m.max_positions
    )
    opt, sched = build_optimizer(model, OptimSection(lr=1e-4, warmup_steps=0), total_steps=3 * steps + 3)
    ids = torch.randint(0, len(tok), (batch, length)).tolist()
    synthetic = sft_batch([(row, [1] * length) for row in ids], tok.pad_token_id or 0)
    demo = demo_sft_batch(tok, recipe, batch)
    settings = {
        SYNTHETIC.format(batch=batch, length=length): (synthetic, 1 << 20),
        PADDED: (demo, 1 << 20),
        MICRO: (demo, 2048),
    }
    samples: dict[str, list] = {k: [] for k in settings}
    learner = Learner(model, opt, sched)
    for b, tokens in settings.values():  # warm-up
        sft_step(learner, b, tokens, 1.0)
    for _ in range(steps):
        for name, (b, tokens) in settings.items():
            samples[name] += timed(lambda b=b, t=tokens: sft_step(learner, b, t, 1.0), 1)
    return samples, demo.attention_mask.sum(dim=1).tolist()


async def sandbox_bench(calls: int, workers: int) -> tuple[float, float]:
    """Trivial calls/s through the demo's local pool (full isolation), and the share that was ok."""
    from rstar2.sandbox import LocalPool

    pool = await LocalPool(workers=workers).start()
    try:
        await pool.run("print(1)")
        t = time.perf_counter()
        results = await asyncio.gather(*(pool.run(f"print({i} * 7)") for i in range(calls)))
        dt = time.perf_counter() - t
    finally:
        await pool.close()
    ok = sum(r.status == "ok" and r.stdout.strip() == str(i * 7) for i, r in enumerate(results))
    return calls / dt, ok / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="SFT steps timed (after one warm-up)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=100, help="tokens per sequence (demo SFT: ~50-100)")
    ap.add_argument("--calls", type=int, default=200, help="trivial sandbox calls")
    ap.add_argument("--workers", type=int, default=2, help="sandbox workers (the demo's sandbox_workers)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as the demo (model.threads: 1)
    recipe = load_recipe(find_recipe("tiny"))
    steps, lengths = sft_step_bench(recipe, args.steps, args.batch, args.length)
    rows = [row("matmul 6400x128x512 (ms)", matmul_bench(50), 1e3)]
    rows += [row(name, v) for name, v in steps.items()]
    by_name = {r["item"]: r for r in rows}
    calls_per_s, ok = asyncio.run(sandbox_bench(args.calls, args.workers))
    step = by_name[SYNTHETIC.format(batch=args.batch, length=args.length)]["wall_median"]
    demo_step = by_name[MICRO]["wall_median"]  # the demo's SFT runs micro-batched (recipes/tiny.yaml)
    sft = recipe.stages[0]
    g = sft.data.generator
    tool_runs = g.count * (1 + g.error_rate) if g else 0
    print(f"{'item':44s} {'n':>4s} {'wall med':>9s} {'min':>8s} {'max':>8s} {'CPU med':>8s} {'CPU/wall':>8s}")
    for r in rows:
        print(
            f"{r['item']:44s} {r['n']:4d} {r['wall_median']:9.3f} {r['wall_min']:8.3f} {r['wall_max']:8.3f} "
            f"{r['cpu_median']:8.3f} {r['cpu_median'] / r['wall_median']:8.2f}"
        )
    print(
        f"demo SFT batch: {len(lengths)} conversations, mean {sum(lengths) / len(lengths):.0f} tokens, "
        f"max {max(lengths)}; micro-batched / padded: {demo_step / by_name[PADDED]['wall_median']:.2f}x"
    )
    print(f"sandbox: {calls_per_s:.1f} trivial calls/s with {args.workers} workers ({ok:.0%} correct)")
    print(f"SFT step vs the prototype's {PROTOTYPE_SFT_STEP_S} s: {step / PROTOTYPE_SFT_STEP_S:.1f}x")
    steps = sft.run["steps"]
    est = tool_runs / calls_per_s + steps * demo_step
    print(
        f"demo SFT stage on this machine: ~{tool_runs:.0f} tool runs + {steps} steps "
        f"= ~{est / 60:.1f} min (RL stages and evaluations come on top)"
    )
    if args.out:
        args.out.write_text(
            json.dumps(
                {"rows": rows, "sandbox_calls_per_s": calls_per_s, "sandbox_ok": ok, "sft_stage_est_s": est},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
