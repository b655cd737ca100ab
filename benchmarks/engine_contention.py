"""How much the in-process engine loses when something else wants the CPU (issue 17).

    python benchmarks/engine_contention.py --model /path/to/SmolLM2 [--rows 64] [--new 96]

During rollouts the engine shares the cores with the event loop's Python (parsing, tokenizing), the
sandbox's calls and the verifier. This measures the engine's isolated decode (``--rows`` of the
SmolLM2 recipe's prompts at once, ``--new`` tokens each, EOS banned) alone and beside a load: a
Python thread of the same process busy 20% of the time, another process busy 20% of one core, one
core fully taken; and with the engine on one thread. The baseline (alone, all threads) runs first
and last; ratios are against their mean.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_rl import chat_settings, problems  # noqa: E402 (the recipe's chat format, its problems)
from rollout import isolated  # noqa: E402

from rstar2.engines.base import SamplingParams  # noqa: E402
from rstar2.engines.hf import HFEngine  # noqa: E402

DUTY = "import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.02: pass\n    time.sleep(0.08)"
SPIN = "while True: pass"


def busy_thread(stop: threading.Event) -> None:
    """20% of one core in this process's Python: 20 ms busy, 80 ms asleep."""
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.02:
            pass
        time.sleep(0.08)


def measure(net, prompts, stop_ids, new: int, threads: int, load: str | None) -> dict:
    proc = None
    stop = threading.Event()
    if load in ("process-20%", "process-100%"):
        proc = subprocess.Popen([sys.executable, "-c", DUTY if load == "process-20%" else SPIN])
    elif load == "thread-20%":
        threading.Thread(target=busy_thread, args=(stop,), daemon=True).start()

    async def go() -> dict:
        engine = HFEngine(net, max_batch_size=len(prompts))
        engine.threads = threads
        try:
            warm = SamplingParams(max_new_tokens=4, banned_token_ids=stop_ids)
            await asyncio.gather(*(engine.generate(p, warm) for p in prompts))
            before = dict(engine.stats)
            rate = (await isolated(engine, prompts, new, stop_ids))["tokens_per_s"]
            s = engine.stats
            steps = s["steps"] - before["steps"]
            decode = (s["busy_s"] - before["busy_s"]) - (s["prefill_s"] - before["prefill_s"])
            return {"tokens_per_s": rate, "decode_step_s": decode / max(1, steps)}
        finally:
            await engine.close()

    try:
        return asyncio.run(go())
    finally:
        stop.set()
        if proc is not None:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", type=Path, required=True, help="an imported SmolLM2 folder (or its checkpoint)"
    )
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--out", type=Path, default=None, help="write the numbers as JSON")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rstar2.chat.format import ChatFormat
    from rstar2.config import RolloutSection

    net = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(a.model)
    fmt = ChatFormat.from_settings(tok, RolloutSection(**chat_settings("smollm2-135m")))
    with tempfile.TemporaryDirectory() as tmp:
        rows = [json.loads(line) for line in problems(Path(tmp), a.rows).read_text().splitlines()]
    prompts = [fmt.prompt_ids(r["problem"]) for r in rows[: a.rows]]
    stop_ids = tuple(t for t in (tok.eos_token_id,) if t is not None)
    full = torch.get_num_threads()
    arms = [
        ("alone", full, None),
        ("a Python thread of this process, 20%", full, "thread-20%"),
        ("another process, 20% of a core", full, "process-20%"),
        ("another process, 100% of a core", full, "process-100%"),
        ("alone, engine on 1 thread", 1, None),
        ("alone (again)", full, None),
    ]
    results = [(name, measure(net, prompts, stop_ids, a.new, t, load)) for name, t, load in arms]
    base = statistics.fmean(
        r["tokens_per_s"] for name, r in results if name.startswith("alone") and "1 thread" not in name
    )
    table = Table(
        title=f"engine under CPU contention ({a.rows} rows x {a.new} new tokens; CPU "
        f"{torch.backends.cpu.get_cpu_capability()}, {full} threads)"
    )
    for c in ("arm", "tokens/s", "× alone", "decode step s"):
        table.add_column(c, justify="right")
    for name, r in results:
        table.add_row(
            name, f"{r['tokens_per_s']:.1f}", f"{r['tokens_per_s'] / base:.2f}×", f"{r['decode_step_s']:.3f}"
        )
    Console(width=140).print(table)
    if a.out:
        a.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "runs": dict(results)}, indent=2)
        )


if __name__ == "__main__":
    main()
