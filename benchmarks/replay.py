"""What ``run.keep_steps`` costs and what a replay takes, on a real RL stage, same run.

    python benchmarks/replay.py --config runs/ship-s1/02-rl-192/config.yaml [--steps 2] [--out DIR]

The config is an RL stage as a recipe ran it (``RUN/NN-NAME/config.yaml``: the SmolLM2 recipe's
rl-192 from its SFT checkpoint). Arms run that stage for ``--steps`` steps from the same start, keep
off and on, in the order off, on, on, off (each order's drift cancels in the mean); the table gives
seconds per step and per update, with the keep-on arms' own cost measured inside the update's
thread (the fingerprints), and the kept size per step. Then the last step of a keep-on arm is
replayed as a user does, ``rstar2 replay RUN --step N`` in a fresh process: the command's seconds
(imports and loading included) and the redo's (RoC, the update, the fingerprints, the comparison),
against the update time the run logged for that step. ``--reuse`` replays the arms already in
``--out`` again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from rstar2.config_files import load_config
from rstar2.rl.run.keep import kept_path, kept_steps, read_kept
from rstar2.rl.run.metrics_log import read_metrics
from rstar2.rl.trainer import RLTrainer


def kept_size(run_dir: Path) -> dict[str, float]:
    """The kept files' size: steps, MB in all and per step."""
    files = [kept_path(run_dir, s) for s in kept_steps(run_dir)]
    total = sum(f.stat().st_size for f in files)
    return {"steps": len(files), "mb": total / 1e6, "mb_per_step": total / 1e6 / max(1, len(files))}


def arm(config: Path, out: Path, steps: int, keep: bool) -> dict:
    cfg = load_config(
        config, [f"run.out={out}", f"run.steps={steps}", "run.save_every=1", "run.progress=false"]
    )
    cfg.run.keep_steps = keep
    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    try:
        asyncio.run(RLTrainer(cfg).train())
    finally:
        torch.set_num_threads(threads)
    rows = read_metrics(out / "metrics.jsonl")
    result = {
        "keep": keep,
        "wall_s": time.perf_counter() - t0,
        "step_s": [r["time/step_s"] for r in rows],
        "update_s": [r["time/update_s"] for r in rows],
    }
    if keep:
        result["fingerprint_s"] = [read_kept(out, s).seconds["fingerprints"] for s in kept_steps(out)]
        result |= kept_size(out)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True, help="an RL stage's config.yaml")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/bench-replay"))
    ap.add_argument("--reuse", action="store_true", help="replay the arms of an earlier run in --out")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.reuse:
        arms = json.loads((args.out / "replay-bench.json").read_text())["arms"]
    else:
        arms = []
        for i, keep in enumerate([False, True, True, False]):
            print(f"[bench] arm {i + 1}/4: keep {'on' if keep else 'off'}", file=sys.stderr, flush=True)
            arms.append(
                arm(args.config, args.out / f"arm{i + 1}-{'keep' if keep else 'plain'}", args.steps, keep)
            )
    kept_run = args.out / "arm3-keep"
    t0 = time.perf_counter()
    command = [sys.executable, "-m", "rstar2", "replay", str(kept_run), "--step", str(args.steps)]
    done = subprocess.run(command, capture_output=True, text=True)
    replay_s = time.perf_counter() - t0
    if done.returncode not in (0, 1):  # 1: the step differs from the run, a result; else it failed
        sys.exit(f"rstar2 replay failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    again = json.loads((kept_run / "replay" / f"step_{args.steps}.json").read_text())
    redo_s = again["steps"][-1]["seconds"]
    logged = read_metrics(kept_run / "metrics.jsonl")[-1]

    def mean(key: str, keep: bool) -> float:
        return statistics.fmean(x for a in arms if a["keep"] == keep for x in a[key])

    on, off = mean("step_s", True), mean("step_s", False)
    fp = statistics.fmean(x for a in arms if a["keep"] for x in a["fingerprint_s"])
    table = Table(title=f"run.keep_steps on {args.config} ({torch.backends.cpu.get_cpu_capability()})")
    for col in ("", "keep off", "keep on", "on / off"):
        table.add_column(col, justify="right")
    table.add_row("s / step", f"{off:.1f}", f"{on:.1f}", f"{on / off:.3f}")
    table.add_row("s / update", f"{mean('update_s', False):.2f}", f"{mean('update_s', True):.2f}", "")
    table.add_row("fingerprints s / step (inside the update)", "", f"{fp:.2f}", f"{fp / off:.3%} of a step")
    size = statistics.fmean(a["mb_per_step"] for a in arms if a["keep"])
    table.add_row("kept MB / step", "", f"{size:.2f}", "")
    table.add_row(
        f"replay of step {args.steps} (from checkpoint {args.steps - 1})",
        "",
        f"{replay_s:.1f} s (redo {redo_s:.1f} s)",
        f"run's update {logged['time/update_s']:.1f} s",
    )
    Console().print(table)
    result = {
        "config": str(args.config),
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "arms": arms,
        "replay_s": replay_s,
        "replay_redo_s": redo_s,
        "replay_equal": done.returncode == 0,
        "run_update_s": logged["time/update_s"],
    }
    (args.out / "replay-bench.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "arms"}))


if __name__ == "__main__":
    main()
