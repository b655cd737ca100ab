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
import inspect
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
from async_rl import engine_inputs, engine_rate, problems  # noqa: E402 (the recipe's prompts, the engine's rate)


def duty(busy_s: float, idle_s: float, stop: threading.Event | None = None) -> None:
    """Keep one core busy ``busy_s`` out of every ``busy_s + idle_s`` seconds (until ``stop``)."""
    while stop is None or not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < busy_s:
            pass
        time.sleep(idle_s)


def duty_process(share: float) -> subprocess.Popen:
    """Another process running ``duty`` at ``share`` of one core."""
    code = f"import threading, time\n{inspect.getsource(duty)}\nduty({0.1 * share}, {0.1 * (1 - share)})"
    return subprocess.Popen([sys.executable, "-c", code])  # the function alone: no torch to import


def measure(net, prompts, stop_ids, new: int, threads: int, load: str | None) -> dict:
    """The engine's rate (``engine_rate``) while ``load`` runs beside it."""
    proc = None
    stop = threading.Event()
    if load in ("process-20%", "process-100%"):
        proc = duty_process(0.2 if load == "process-20%" else 1.0)
    elif load == "thread-20%":  # 20% of one core in this process's Python
        threading.Thread(target=duty, args=(0.02, 0.08, stop), daemon=True).start()
    try:
        return engine_rate(net, prompts, new, stop_ids, threads)
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
    with tempfile.TemporaryDirectory() as tmp:
        net, prompts, stop_ids = engine_inputs(a.model, problems(Path(tmp), a.rows), a.rows, "smollm2-135m")
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
