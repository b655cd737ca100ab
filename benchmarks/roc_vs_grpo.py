"""GRPO-RoC against plain GRPO on the tiny recipe, over several seeds, from one shared SFT model.

Variants (every RL stage of the recipe, same problems, same steps):
- ``roc``: 2G = 16 rollouts per problem, RoC keeps G = 8 (the recipe's default);
- ``grpo-kept``: plain GRPO on 8 rollouts per problem (equal numbers of trajectories trained on);
- ``grpo-generated``: plain GRPO on all 16 (equal numbers of trajectories generated).

Prints a table (held-out accuracy after the last stage, tool-error ratio in correct trajectories
over the last steps, mean response length; mean ± spread over seeds) and writes a PNG of those three
over the steps, with the spread over seeds, and a JSON of every number.

    python benchmarks/roc_vs_grpo.py [--recipe tiny] [--seeds 3] [--out runs/roc-vs-grpo]
        [--sft runs/tiny/01-sft/checkpoints/step-000450] [--variants roc,grpo-kept] [--set KEY=VALUE]

Runs that finished are read back, not run again: processes with different ``--variants`` can share
one ``--out`` and a last call with all of them prints the whole table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import yaml

from rstar2.config import set_value
from rstar2.recipe.run import run_recipe
from rstar2.recipe.spec import find_recipe, parse_recipe

VARIANTS: dict[str, dict[str, Any]] = {
    "roc": {"samples": 16, "keep": 8, "roc": {"enabled": True}},
    "grpo-kept": {"samples": 8, "roc": {"enabled": False}},
    "grpo-generated": {"samples": 16, "roc": {"enabled": False}},
}
CURVES = {
    "tools/error_ratio_correct_all": "tool-error ratio in correct trajectories",
    "accuracy": "sampled accuracy (training problems)",
    "response/length_mean": "mean response length (tokens)",
}


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """Every RL step of every stage of a run, in order, numbered across stages."""
    rows: list[dict[str, Any]] = []
    for stage in sorted(p for p in run.iterdir() if p.is_dir() and p.name[:2].isdigit()):
        f = stage / "metrics.jsonl"
        if f.exists():
            rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    for i, r in enumerate(rows, 1):
        r["global_step"] = i
    return rows


def held_out(run: Path) -> dict[str, float]:
    evals = json.loads((run / "recipe_state.json").read_text()).get("evals", {})
    return {stage: float(e.get("pass@1", float("nan"))) for stage, e in evals.items()}


def spread(xs: list[float], digits: int = 3) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "—"
    return f"{statistics.fmean(xs):.{digits}f} ({min(xs):.{digits}f} – {max(xs):.{digits}f})"


def _sft_model(args, tree: dict[str, Any], path: Path, sft_stages: list[dict]) -> str | None:
    """The SFT checkpoint every variant starts from (``--sft``, or trained once into ``OUT/sft``)."""
    if args.sft:
        if not (args.sft / "config.json").exists():
            raise SystemExit(f"--sft {args.sft}: not a model folder (no config.json)")
        return str(args.sft)
    if not sft_stages:
        return None
    sft_out = args.out / "sft"
    state_file = sft_out / "recipe_state.json"
    if not state_file.exists() or not json.loads(state_file.read_text()).get("stages"):
        run_recipe(
            parse_recipe({**tree, "stages": sft_stages}, path.parent), sft_out, resume=sft_out.exists()
        )
    return json.loads(state_file.read_text())["stages"][sft_stages[-1]["name"]]["checkpoint"]


def plot(results: dict[str, list[list[dict[str, Any]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(5 * len(CURVES), 3.8))
    for ax, (key, title) in zip(axes, CURVES.items(), strict=True):
        for variant, runs in results.items():
            steps = min((len(r) for r in runs), default=0)
            if not steps:
                continue
            vals = [[r[i].get(key, float("nan")) for r in runs] for i in range(steps)]
            mean = [statistics.fmean(v) for v in vals]
            ax.plot(range(1, steps + 1), mean, label=variant)
            ax.fill_between(range(1, steps + 1), [min(v) for v in vals], [max(v) for v in vals], alpha=0.2)
        ax.set_title(title)
        ax.set_xlabel("RL step (all stages)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="tiny")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("runs/roc-vs-grpo"))
    ap.add_argument("--sft", type=Path, help="start every variant from this SFT checkpoint (skips SFT)")
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS)
    )
    ap.add_argument(
        "--set", dest="overrides", action="append", default=[], help="recipe overrides (as --set)"
    )
    args = ap.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := [v for v in variants if v not in VARIANTS]:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")

    path = find_recipe(args.recipe)
    tree = yaml.safe_load(path.read_text())
    for o in args.overrides:
        set_value(tree, o)
    sft_stages = [s for s in tree["stages"] if s["kind"] == "sft"]
    rl_stages = [s for s in tree["stages"] if s["kind"] == "rl"]
    if not rl_stages:
        raise SystemExit(f"{path}: no RL stage to compare on")

    sft_ckpt = _sft_model(args, tree, path, sft_stages)
    results: dict[str, list[list[dict[str, Any]]]] = {v: [] for v in variants}
    finals: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for seed in range(args.seeds):
        for variant in variants:
            change = VARIANTS[variant]
            run = args.out / f"{variant}-seed{seed}"
            model = dict(tree["model"])
            if sft_ckpt:
                model = {
                    k: v
                    for k, v in model.items()
                    if k not in ("build", "vocab", "hidden", "layers", "heads", "mlp", "max_positions")
                }
                model["path"] = sft_ckpt
            stages = [
                {
                    **s,
                    **{k: v for k, v in change.items() if k != "roc"},
                    "roc": {**s.get("roc", {}), **change["roc"]},
                }
                for s in rl_stages
            ]
            # each seed draws its own held-out problems: evaluate the starting model on them too
            evals = {**tree.get("eval", {}), "before": True}
            recipe = parse_recipe(
                {**tree, "seed": seed, "model": model, "stages": stages, "eval": evals}, path.parent
            )
            print(f"== {variant}, seed {seed} -> {run}", flush=True)
            run_recipe(recipe, run, resume=run.exists())
            rows = read_metrics(run)
            results[variant].append(rows)
            accuracy = held_out(run)
            tail = rows[-5:]
            finals[variant].append(
                {
                    "held_out_start": accuracy.get("start", float("nan")),
                    "held_out": list(accuracy.values())[-1] if accuracy else float("nan"),
                    "error_ratio_correct": statistics.fmean(
                        r.get("tools/error_ratio_correct_all", 0.0) for r in tail
                    )
                    if tail
                    else float("nan"),
                    "length": statistics.fmean(r.get("response/length_mean", 0.0) for r in tail)
                    if tail
                    else float("nan"),
                }
            )
    print(
        "\n| variant | held-out accuracy after the last stage | rise over the SFT model (points) "
        "| tool-error ratio in correct (last 5 steps) | response length (last 5 steps) |\n|---|---|---|---|---|"
    )
    for variant, fs in finals.items():
        rise = [100 * (f["held_out"] - f["held_out_start"]) for f in fs]
        print(
            f"| {variant} | {spread([f['held_out'] for f in fs])} | {spread(rise, 1)} "
            f"| {spread([f['error_ratio_correct'] for f in fs])} | {spread([f['length'] for f in fs])} |"
        )
    print(f"\nmean (min – max) over {args.seeds} seeds; SFT model shared: {sft_ckpt}")
    plot(results, args.out / "roc_vs_grpo.png")
    (args.out / "roc_vs_grpo.json").write_text(json.dumps({"finals": finals, "metrics": results}, indent=1))
    print(f"plots: {args.out / 'roc_vs_grpo.png'}")


if __name__ == "__main__":
    main()
