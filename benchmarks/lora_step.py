"""An RL step of the SmolLM2 recipe training every weight against training an adapter (issue 30):
update time, step time, peak memory, trainable parameters and what a weight sync sends.

    python benchmarks/lora_step.py runs/sft-s0 [--ranks 1,16,64] [--steps 2] [--out runs/lora-step]

From the SFT checkpoint of a SmolLM2 recipe run (``benchmarks/sft_checkpoint.py`` makes one), each
setting runs the recipe's first RL stage for ``--steps`` steps in a process of its own (``rstar2
train``: its peak memory is its own), one after the other, from the same seed. A new adapter
computes exactly what the model does (its B is zero), so every setting's first step samples the
same rollouts: step 1's update is timed on the same tokens. What a served engine would be sent
after each update: the model's ``model.safetensors``, or the adapter's file alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import yaml


def stage_config(run: Path, out: Path, steps: int, lora: dict | None) -> dict:
    """The recipe's first RL stage as ``rstar2 train`` takes it, from the run's SFT checkpoint."""
    from rstar2.jsonl import write_jsonl
    from rstar2.recipe.curriculum import problem_rows
    from rstar2.recipe.spec import load_recipe, stage_tree

    recipe = load_recipe(run / "recipe.yaml")
    stage = next(s for s in recipe.stages if s.kind == "rl")
    state = json.loads((run / "recipe_state.json").read_text())
    problems = out / "problems.jsonl"
    write_jsonl(problem_rows(stage.data, recipe.seed), problems)
    tree = stage_tree(
        recipe, stage, model_path=state["stages"]["sft"]["checkpoint"], train=str(problems), out="-"
    )
    tree["model"]["lora"] = lora
    tree["run"].update(steps=steps, save_every=steps, progress=False, kl_to_start=False)
    return tree


def run_setting(run: Path, out: Path, name: str, steps: int, lora: dict | None) -> dict:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    tree = stage_config(run, out, steps, lora)
    tree["run"]["out"] = str(folder / "run")
    config = folder / "rl.yaml"
    config.write_text(yaml.safe_dump(tree))
    done = subprocess.run(
        [sys.executable, "-m", "rstar2", "train", str(config)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{name}: rstar2 train failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(x) for x in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    ckpt = sorted((folder / "run" / "checkpoints").iterdir())[-1]
    sent = ckpt / ("adapter_model.safetensors" if lora else "model.safetensors")
    first = rows[0]
    return {
        "setting": name,
        "update_s_step1": first["time/update_s"],
        "update_s_mean": sum(r["time/update_s"] for r in rows) / len(rows),
        "step_s_mean": sum(r["time/step_s"] for r in rows) / len(rows),
        "peak_gib": max(r["memory/peak_gib"] for r in rows),
        "reward_step1": first["reward/mean"],
        "tokens_step1": first["response/length_mean"],
        "sync_bytes": sent.stat().st_size,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a SmolLM2 recipe run with its SFT checkpoint")
    ap.add_argument("--ranks", default="1,16,64")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/lora-step"))
    ap.add_argument("--json", type=Path, help="write the rows here too")
    args = ap.parse_args()
    settings = [("full", None)] + [(f"rank {r}", {"rank": int(r)}) for r in args.ranks.split(",")]
    rows = [run_setting(args.run, args.out, n.replace(" ", "-"), args.steps, lora) for n, lora in settings]
    for row, (name, _) in zip(rows, settings, strict=True):
        row["setting"] = name
    full = rows[0]
    cpu = torch.backends.cpu.get_cpu_capability()
    print(
        f"\nSmolLM2-135M, the recipe's first RL stage from {args.run}, {args.steps} steps a setting; CPU {cpu}\n"
    )
    print(
        "| setting | update s (step 1) | vs full | update s (mean) | step s (mean) | peak GiB | vs full | sent per sync | vs full | reward step 1 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['setting']} | {r['update_s_step1']:.1f} | {r['update_s_step1'] / full['update_s_step1']:.2f}x "
            f"| {r['update_s_mean']:.1f} | {r['step_s_mean']:.1f} | {r['peak_gib']:.2f} "
            f"| {r['peak_gib'] / full['peak_gib']:.2f}x | {r['sync_bytes'] / 2**20:.1f} MiB "
            f"| {r['sync_bytes'] / full['sync_bytes']:.2%} | {r['reward_step1']:.3f} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"cpu": cpu, "run": str(args.run), "steps": args.steps, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
