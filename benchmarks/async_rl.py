"""Asynchronous RL (``asynchronous.max_staleness``) against the synchronous loop, in-process, same run.

Each arm runs the RL trainer for ``--steps`` steps from the same model, data and seed, with the
in-process engine and the real code environment and verifier; only ``asynchronous.max_staleness`` (k)
differs (k > 0 with the decoupled objective, ``loss.tis_cap: 2``). The reward is the parity of the
first sampled token, or with ``--reward length`` of the response's length (groups of mixed rewards,
so every step updates whatever the model knows: this measures time, not learning). The first step is a warm-up and is not counted. Arms run in the order given, then reversed (A-B-C-C-B-A with ``--repeat 2``), and
the table shows means: wall seconds per trained rollout, model tokens per second, the update's
and weight sync's seconds, the seconds a step waited for its rollouts, the engine's busy share of
the step, its occupancy (rows a decode step held / its rows) and the share of its busy time spent
joining requests (prefill), staleness. Ratios are against k = 0 of the same run. ``--isolated N``
also measures the engine's own rate in the same run, before the arms and after them: the step's
prompts (the recipe's chat format), ``--batch-rows`` of them at once, N new tokens each, nothing
else running. "model tokens/s" is per second of the steps; "tokens/s generating" per second the
engine had rollouts to generate (at k = 0 the rollout phase, at k > 0 the whole step, the update
sharing the cores); ``× isolated`` is the latter over the isolated rate.

    python benchmarks/async_rl.py --model /tmp/rstar2-bench-smollm2 [--steps 4] [--staleness 0,1,2]
    python benchmarks/async_rl.py            # the tiny recipe's model shape, built here
    python benchmarks/async_rl.py --model /tmp/rstar2-bench-smollm2 --disaggregated
    python benchmarks/async_rl.py --model /tmp/smollm2 --disaggregated --engine vllm --staleness 0,1

``--disaggregated``: the field's layout on one 2-core machine: the engine is ``rstar2 serve`` in
its own process pinned to core 0 (one thread; restarted for each arm, on the starting weights), the
trainer (and its code environment and verifier) pinned to core 1 with one thread — stand-ins for an
inference GPU and a training GPU. The trainer pushes its weights to the server after each update.
``--engine vllm``: the server is vLLM (``rstar2 vllm``, engine bound to core 0), which keeps no
engine counters (those columns are nan).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from rstar2.auth import client_headers
from rstar2.config_files import parse_config
from rstar2.engines.hf import HFEngine
from rstar2.local_service import free_port, wait_healthy
from rstar2.rl.trainer import RLTrainer
from rstar2.tasks.generator import generate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout import isolated  # noqa: E402 (the engine's isolated rate, as benchmarks/rollout.py takes it)


def first_token_even(traj) -> float:
    return float(bool(traj.response_ids) and traj.response_ids[0] % 2 == 0)


def length_even(traj) -> float:
    """For a model that always opens the same way (an SFT'd one): the response length's parity."""
    return float(len(traj.response_ids) % 2 == 0)


REWARDS = {"first-token": first_token_even, "length": length_even}


def problems(root: Path, n: int) -> Path:
    rows = [t.row() for t in generate(n, seed=7)]
    path = root / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_model(root: Path) -> Path:
    from rstar2.recipe.spec import find_recipe, load_recipe
    from rstar2.recipe.tiny_model import build_model, build_tokenizer, save_pretrained, tiny_corpus

    recipe = load_recipe(find_recipe("tiny"))
    m = recipe.model
    tok = build_tokenizer(tiny_corpus(recipe), m.vocab)
    model = build_model(
        tok, hidden=m.hidden, layers=m.layers, heads=m.heads, mlp=m.mlp, max_positions=m.max_positions
    )
    return save_pretrained(model, tok, root / "tiny")


def chat_settings(recipe: str) -> dict:
    """The chat format of a shipped recipe (system prompt, tools in the prompt, tool output limits),
    read from its YAML (the recipe's model need not be installed)."""
    import yaml

    from rstar2.config import ChatSection
    from rstar2.recipe.spec import find_recipe

    rollout = yaml.safe_load(find_recipe(recipe).read_text()).get("rollout", {})
    return {k: v for k, v in rollout.items() if k in ChatSection.model_fields}


def on_core_0(
    command: list[str], what: str, timeout_s: float, env: dict | None = None
) -> tuple[subprocess.Popen, str]:
    """``rstar2 COMMAND --port P`` pinned to core 0; the process and its URL once it answers."""
    port = free_port()
    cmd = ["taskset", "-c", "0", sys.executable, "-m", "rstar2", *command, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s, what)
    except RuntimeError:
        proc.kill()
        raise
    return proc, url


# the runs these benchmarks make live in temporary folders: the servers load weights from there
WEIGHTS_FROM = ["--weights-from", tempfile.gettempdir()]


def start_server(model: Path, rows: int) -> tuple[subprocess.Popen, str]:
    """``rstar2 serve`` on core 0 with one thread."""
    command = [
        "serve",
        "--model",
        str(model),
        "--device",
        "cpu",
        "--max-batch-size",
        str(rows),
        *WEIGHTS_FROM,
    ]
    return on_core_0(
        command, "rstar2 serve", 300, {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    )


def start_vllm(model: Path, eager: bool) -> tuple[subprocess.Popen, str]:
    """``rstar2 vllm`` on core 0 (its engine bound there, its API server beside it)."""
    command = [
        "vllm",
        "--model",
        str(model),
        "--dtype",
        "float32",
        "--cores",
        "0",
        "--kv-cache-gib",
        "2",
        *WEIGHTS_FROM,
    ]
    return on_core_0(command + (["--eager"] if eager else []), "rstar2 vllm", 600)


def engine_inputs(
    model: Path, data: Path, rows: int, recipe: str, device: str = "cpu"
) -> tuple[Any, list[list[int]], tuple[int, ...]]:
    """The model (fp32, on ``device``), ``rows`` of ``data``'s prompts in ``recipe``'s chat format,
    and EOS (to ban)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rstar2.chat.format import ChatFormat
    from rstar2.config import RolloutSection
    from rstar2.device import pick_device

    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval().to(pick_device(device))
    tok = AutoTokenizer.from_pretrained(model)
    fmt = ChatFormat.from_settings(tok, RolloutSection(**chat_settings(recipe)))
    problems = [json.loads(line)["problem"] for line in data.read_text().splitlines()]
    prompts = [fmt.prompt_ids(problems[i % len(problems)]) for i in range(rows)]
    return net, prompts, tuple(t for t in (tok.eos_token_id,) if t is not None)


def engine_rate(
    net: Any,
    prompts: list[list[int]],
    new: int,
    stop: tuple[int, ...],
    threads: int | None = None,
    cuda_graphs: bool | None = None,
) -> dict:
    """A fresh in-process engine decoding ``prompts`` at once, ``new`` tokens each (``stop`` banned:
    every row runs its full length), after a warm-up of the whole batch: its model tokens/s and the
    seconds of one decode step. ``threads``: the engine thread's torch threads (None: all);
    ``cuda_graphs``: the engine's (None: on a GPU)."""
    from rstar2.engines.base import SamplingParams

    async def go() -> dict:
        engine = HFEngine(net, max_batch_size=len(prompts), cuda_graphs=cuda_graphs)
        engine.threads = threads
        try:
            warm = SamplingParams(max_new_tokens=4, banned_token_ids=stop)
            await asyncio.gather(*(engine.generate(p, warm) for p in prompts))
            before = dict(engine.stats)
            rate = (await isolated(engine, prompts, new, stop))["tokens_per_s"]
            d = {k: engine.stats[k] - before[k] for k in ("steps", "busy_s", "prefill_s")}
            return {
                "tokens_per_s": rate,
                "decode_step_s": (d["busy_s"] - d["prefill_s"]) / max(1, d["steps"]),
            }
        finally:
            await engine.close()

    return asyncio.run(go())


def isolated_rate(model: Path, data: Path, a) -> float:
    """The in-process engine's model tokens/s decoding ``--batch-rows`` of the step's prompts at
    once, ``--isolated`` new tokens each."""
    net, prompts, stop = engine_inputs(model, data, a.batch_rows, a.chat_from_recipe, a.device)
    return engine_rate(net, prompts, a.isolated, stop)["tokens_per_s"]


def parse_arm(arm: str) -> tuple[int, str, int | None]:
    """``arm`` = k, then optionally keep / pause / split / eager (no CUDA graphs), then optionally
    ``r`` and the engine's rows (default ``--batch-rows``): "1", "1pause", "1r32", "0eager"."""
    m = re.fullmatch(r"(\d+)(keep|pause|split|eager)?(?:r(\d+))?", arm)
    if m is None:
        raise SystemExit(f"unknown arm {arm!r}: k[keep|pause|split|eager][rROWS]")
    k, kind, rows = m.groups()
    return int(k), kind or "", int(rows) if rows else None


def arm_k(arm: str) -> int:
    return parse_arm(arm)[0]


def run_arm(model: Path, data: Path, out: Path, arm: str, a) -> dict:
    """``arm``: k, or k + "keep" (``asynchronous.keep_stale_kv``: no prefill again on new weights), or
    k + "pause" (in-process: the engine waits while the update runs instead of decoding beside it),
    or k + "split" (in-process: ``asynchronous.engine_threads`` half the threads: while the update runs
    the engine's thread and the update's each use half, not two OpenMP teams on the same cores),
    or k + "eager" (``rollout.engine.cuda_graphs: false``: on a GPU, the decode step without graphs);
    any of them with ``r`` and the engine's rows (``parse_arm``)."""
    k, kind, rows = parse_arm(arm)
    keep, pause, split, eager = (kind == x for x in ("keep", "pause", "split", "eager"))
    rows = rows or a.batch_rows
    server = None
    if a.disaggregated:
        server, url = (
            start_vllm(model, a.engine == "vllm-eager") if a.engine != "serve" else start_server(model, rows)
        )
    tree = {
        "kind": "rl",
        "model": {"path": str(model), "compute": a.compute, "device": a.device},
        "data": {"train": str(data), "shuffle": False},
        "rollout": {
            **chat_settings(a.chat_from_recipe),
            "samples": a.samples,
            "max_turns": a.max_turns,
            "max_response_tokens": a.max_response_tokens,
            "engine": {
                "max_batch_size": rows,
                **({"cuda_graphs": False} if eager else {}),
                **({"servers": [url], "weight_check_tol": None} if server else {}),
            },
            "sandbox_workers": 1,
            "verifier_workers": 1,
        },
        "asynchronous": {
            "max_staleness": k,
            "keep_stale_kv": keep,
            "engine_threads": max(1, torch.get_num_threads() // 2) if split else None,
        },
        "roc": {"keep": max(1, a.samples // 2)},
        "optim": {"lr": 1e-6, "warmup_steps": 0, "micro_batch_tokens": a.micro_batch_tokens},
        "run": {
            "out": str(out),
            "steps": a.steps,
            "batch_size": a.problems,
            "seed": 0,
            "save_every": 10_000,
            "tensorboard": False,
            "progress": False,
            "samples_per_step": 0,
        },
    }
    if k:
        tree["loss"] = {"tis_cap": 2.0}
    trainer = RLTrainer(parse_config(tree), reward_fn=REWARDS[a.reward])
    trainer.save = lambda metrics=None: None  # time steps, not checkpoints
    if pause:  # the engine held between two steps for the whole update
        off_loop = trainer.off_loop

        def paused(update, *args, **kw):
            def held(*args, **kw):
                with trainer.engines.engines[0].paused():
                    return update(*args, **kw)

            return off_loop(held, *args, **kw)

        trainer.off_loop = paused
    t0 = time.perf_counter()
    try:
        history = asyncio.run(trainer.train())
        wall = time.perf_counter() - t0
        if server is None:
            stats = trainer.engines.engines[0].stats
        elif a.engine == "serve":
            import httpx

            stats = httpx.get(url + "/get_server_info", headers=client_headers()).json()["engine"]
        else:  # vLLM keeps no such counters
            stats = {k: float("nan") for k in ("reprefills", "busy_s", "prefill_s", "generated_tokens")}
            stats |= {"steps": 1, "row_steps": float("nan")}
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
    counted = history[1:]
    seconds = sum(m["time/step_s"] for m in counted)
    rollouts = sum(m["rollouts"] for m in counted)
    # the trainer reports a step's model tokens per second of its rollout phase at k = 0, of the
    # whole step at k > 0 (the engine generates beside the update)
    spans = [m["time/step_s" if k else "time/rollout_s"] for m in counted]
    tokens = [m["tokens_per_s"] * span for m, span in zip(counted, spans, strict=True)]
    return {
        "k": arm,
        "reprefills": stats["reprefills"],
        "wall_s": wall,
        "s_per_rollout": seconds / rollouts,
        "tokens_per_s": sum(tokens) / seconds,  # model tokens per wall second of the steps
        "generating_tokens_per_s": sum(tokens) / sum(spans),  # ... per second the engine had rollouts
        "update_s": statistics.fmean(m["time/update_s"] for m in counted),
        "sync_s": statistics.fmean(m["time/sync_s"] for m in counted),
        "wait_s": statistics.fmean(m["time/rollout_s"] for m in counted),
        # the trainer's per-step engine metrics (rstar2.rl.run.step_metrics.engine_metrics), counted steps
        "occupancy": statistics.fmean(m.get("engine/occupancy", float("nan")) for m in counted),
        "join_share": statistics.fmean(m.get("engine/join_share", float("nan")) for m in counted),
        "busy_share": statistics.fmean(m.get("engine/busy_share", float("nan")) for m in counted),
        "staleness_mean": statistics.fmean(m.get("staleness/mean", 0.0) for m in counted),
        "staleness_max": max(m.get("staleness/max", 0.0) for m in counted),
        "accuracy": statistics.fmean(m["accuracy"] for m in counted),
        # the whole run's decode steps (warm-up included): seconds and rows a step
        "decode_step_s": (stats["busy_s"] - stats["prefill_s"]) / max(1, stats["steps"]),
        "rows_per_step": stats["row_steps"] / max(1, stats["steps"]),
        # the engine's own count of sampled tokens a step, and the trainer's (model tokens of the
        # trained steps' rollouts)
        "engine_tokens_per_step": stats["generated_tokens"] / len(history),
        "model_tokens_per_step": statistics.fmean(tokens),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a model folder (default: the tiny shape)")
    ap.add_argument(
        "--chat-from-recipe",
        default=None,
        help="whose chat format (default: tiny, or smollm2-135m with --model)",
    )
    ap.add_argument(
        "--staleness",
        default="0,1,2",
        help="arms: k, or k followed by 'keep' (keep_stale_kv), 'pause' (the engine stops for the "
        "update) or 'split' (engine and update one intra-op thread each)",
    )
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--problems", type=int, default=4, help="problems a step")
    ap.add_argument("--samples", type=int, default=8, help="rollouts a problem (2G)")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-response-tokens", type=int, default=256)
    ap.add_argument("--batch-rows", type=int, default=32, help="the engine's max_batch_size")
    ap.add_argument("--repeat", type=int, default=2, help="1: A-B-C; 2: A-B-C-C-B-A")
    ap.add_argument("--out", type=Path, default=None, help="write the raw numbers as JSON")
    ap.add_argument("--disaggregated", action="store_true", help="engine on core 0, trainer on core 1")
    ap.add_argument(
        "--engine",
        choices=("serve", "vllm", "vllm-eager"),
        default="serve",
        help="--disaggregated: the server, rstar2 serve or rstar2 vllm (compiled, or --eager)",
    )
    ap.add_argument(
        "--isolated",
        type=int,
        default=0,
        help="also the engine's isolated rate: --batch-rows prompts x this many new tokens (0: no)",
    )
    ap.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=16384,
        help="optim.micro_batch_tokens (the SmolLM2 recipe's 1024 for 64 multi-turn rollouts: at 16384 "
        "a 49K vocabulary's logits take 24 GB)",
    )
    ap.add_argument(
        "--reward",
        choices=sorted(REWARDS),
        default="first-token",
        help="a reward of mixed values whatever the model knows: the first token's parity, or the "
        "response length's (for an SFT'd model, whose first token is always the same)",
    )
    ap.add_argument(
        "--device", default="cpu", help="model.device of the arms: cpu, cuda (auto: CUDA when present)"
    )
    ap.add_argument("--compute", default="fp32", help="model.compute of the arms (auto: bf16 where native)")
    a = ap.parse_args()
    if a.disaggregated:  # this process (the trainer, its sandbox and verifier) on core 1
        os.sched_setaffinity(0, {1})
        torch.set_num_threads(1)
    ks = a.staleness.split(",")
    a.chat_from_recipe = a.chat_from_recipe or ("smollm2-135m" if a.model else "tiny")
    order = ks + (ks[::-1] if a.repeat > 1 else [])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = a.model or tiny_model(root)
        most = max(arm_k(k) for k in ks)
        data = problems(root, a.problems * (a.steps + most + 1))
        alone = [isolated_rate(model, data, a)] if a.isolated and not a.disaggregated else []
        runs = [run_arm(model, data, root / f"run-{i}-k{k}", k, a) for i, k in enumerate(order)]
        alone += [isolated_rate(model, data, a)] if alone else []
    by_k = {k: [r for r in runs if r["k"] == k] for k in ks}
    mean = {
        k: {key: statistics.fmean(r[key] for r in rs) for key in rs[0] if key != "k"}
        for k, rs in by_k.items()
    }
    base = mean[ks[0]]
    table = Table(
        title=f"asynchronous RL, {f'disaggregated: {a.engine} on core 0, trainer on core 1' if a.disaggregated else 'in-process'} ({model.name if a.model else 'tiny'}; CPU "
        f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads; "
        f"device {a.device}; {a.problems}x{a.samples} rollouts a step, {a.steps - 1} steps counted, means of {a.repeat})"
    )
    cols = ("k", "s / trained rollout", "× k=0 (speed)", "model tokens/s", "tokens/s generating")
    cols += ("update s", "sync s", "wait s") + (("× isolated",) if alone else ())
    cols += ("engine busy", "occupancy", "join share", "decode step s (rows)", "staleness mean / max")
    cols += ("accuracy",)
    for c in cols:
        table.add_column(c, justify="right")
    for k, m in mean.items():
        table.add_row(
            k,
            f"{m['s_per_rollout']:.3f}",
            f"{base['s_per_rollout'] / m['s_per_rollout']:.2f}×",
            f"{m['tokens_per_s']:.1f}",
            f"{m['generating_tokens_per_s']:.1f}",
            f"{m['update_s']:.2f}",
            f"{m['sync_s']:.2f}",
            f"{m['wait_s']:.2f}",
            *([f"{m['generating_tokens_per_s'] / statistics.fmean(alone):.2f}×"] if alone else []),
            f"{100 * m['busy_share']:.0f}%",
            f"{100 * m['occupancy']:.0f}%",
            f"{100 * m['join_share']:.0f}%",
            f"{m['decode_step_s']:.3f} ({m['rows_per_step']:.0f})",
            f"{m['staleness_mean']:.2f} / {m['staleness_max']:.0f}",
            f"{100 * m['accuracy']:.1f}%",
        )
    Console(width=180).print(table)
    if alone:
        print(
            f"isolated: {a.batch_rows} prompts x {a.isolated} new tokens, "
            + ", ".join(f"{r:.1f}" for r in alone)
            + " model tokens/s (before, after the arms)"
        )
    if a.out:
        a.out.write_text(
            json.dumps(
                {
                    "runs": runs,
                    "isolated_tokens_per_s": alone,
                    "args": {k: str(v) for k, v in vars(a).items()},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
