"""What moves transfer: the SmolLM2 recipe's training data, two ways, over seeds (issue 25).

    python benchmarks/transfer_ablation.py --model /path/to/imported/SmolLM2 --out runs/chains-ablation \
        [--variants relations,chains] [--seeds 0,1] [--set KEY=VALUE ...]

Variants (whole recipe runs, SFT included, each in OUT/VARIANT-sSEED; a stopped ablation resumes):

- ``relations``: the stages of issue 20 (the recipe before issue 25, its data and step counts): SFT on
  four arithmetic families and the relation families' situations of one to three steps, RL on all
  families up to three steps, each RL stage on the difficulty ladder;
- ``chains``: the recipe as shipped: also stories of up to four relations in SFT (about half of it) and
  up to six in RL (forwards and backwards, tasks/chains.py), reasoning-gym's arithmetic chains in RL,
  and a last stage on the chains alone.

Every run is evaluated on the same sets, after SFT and at the end: the shipped recipe's held-out
problems (128 of its first RL stage's generator: every family, one to six relations), and three sets
never trained on: ``paraphrased``, ``transfer`` and 200 of reasoning-gym's ``gsm_symbolic``. The
zero-shot evaluations are the same model in every run, so the runs skip them; a ``chains`` run is the
shipped recipe with those left out, so a finished ``rstar2 demo --recipe smollm2-135m`` run of the same
seed can stand for it (link it as OUT/chains-sSEED; the shipped recipe evaluates the other sets after
SFT no more, so such a run has no after-SFT figure there). The table gives each set's final
accuracy (mean over seeds, 95% interval over seed x problem) and the change from the first variant,
paired over (seed, problem); minutes and peak memory a run.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from rstar2.config_files import set_value
from rstar2.eval.metrics import mean_ci95, per_problem_accuracy
from rstar2.problems import source_name
from rstar2.recipe.compare import measured
from rstar2.recipe.report_card import eval_dir, paired_change, sampled_trajectories
from rstar2.recipe.run import run_recipe
from rstar2.recipe.spec import find_recipe, parse_recipe
from rstar2.rollout.trajectory import read_trajectories

VARIANTS = ("relations", "chains")
# each set never trained on, by the source its evaluation reads (its folder: problems.source_name)
ALSO = {
    "paraphrased": "paraphrased",
    "transfer": "transfer",
    "gsm_symbolic": "gym:gsm_symbolic?size=200&seed=0",
}
SETS = ("heldout", *ALSO)


def variant_tree(tree: dict[str, Any], variant: str, seed: int, model: str, overrides: list[str]) -> dict:
    t = copy.deepcopy(tree)
    t["model"] = {k: v for k, v in t["model"].items() if k not in ("source", "build")} | {"path": model}
    t["seed"] = seed
    t["name"] = f"{t['name']}-{variant}-s{seed}"
    sft, rl, hard = t["stages"]
    # the shipped recipe's held-out problems (what its eval reads: its first RL stage's generator,
    # split heldout, plain wording), for every variant alike
    held_out = rl["data"]["generator"] | {"count": t["eval"]["count"]}
    t["eval"] = {
        **t["eval"],
        "before": False,
        "plain_before": False,
        "entropy_trajectories": 0,
        "data": {"generator": held_out},
        "also": list(ALSO.values()),
        "also_at": [sft["name"]],  # the shipped recipe evaluates them zero-shot and at the end only
    }
    if variant == "relations":  # the recipe's stages at commit 9ecfdfc, before the chains
        for stage in (sft, rl, hard):
            stage["data"]["generator"].pop("weights", None)
        sft["run"]["steps"], rl["run"]["steps"], hard["run"]["steps"] = 40, 14, 5
        sft["data"]["generator"] |= {"families": ["product", "sum", "quotient", "remainder", "relations"]}
        sft["data"]["generator"] |= {"levels": [1, 3], "count": 480}
        rl["data"] = {
            "generator": rl["data"]["generator"] | {"families": ["arithmetic", "relations"], "levels": [1, 3]}
        }
        hard["data"]["generator"] |= {
            "families": ["arithmetic", "relations"],
            "digits": [3, 4],
            "levels": [2, 3],
        }
    elif variant != "chains":
        raise ValueError(f"unknown variant {variant!r}: choose from {', '.join(VARIANTS)}")
    for o in overrides:
        set_value(t, o)
    return t


def final(folder: Path, tree: dict, label: str) -> dict[str, dict[Any, float]]:
    """Per-problem accuracy of each set evaluated after stage ``label`` (its index in the recipe)."""
    names = [s["name"] for s in tree["stages"]]
    n = names.index(label) + 1
    where = {"heldout": eval_dir(folder, n, label)}
    where |= {s: eval_dir(folder, n, f"{label}-{source_name(source)}") for s, source in ALSO.items()}
    where = {k: sampled_trajectories(d) for k, d in where.items()}
    return {k: per_problem_accuracy(read_trajectories(f)[0]) for k, f in where.items() if f.exists()}


def summarize(out: Path, plan: list[tuple[str, int, dict]], costs: dict[str, Any]) -> str:
    variants = list(dict.fromkeys(v for v, _, _ in plan))
    seeds = sorted({s for _, s, _ in plan})
    acc: dict[tuple[str, int], dict] = {}
    sft: dict[tuple[str, int], dict] = {}
    for v, s, tree in plan:
        folder = out / f"{v}-s{s}"
        acc[v, s] = final(folder, tree, tree["stages"][-1]["name"])
        sft[v, s] = final(folder, tree, tree["stages"][0]["name"])
    ref = variants[0]
    lines = [
        f"Seeds {', '.join(map(str, seeds))}; final accuracy (after SFT in brackets, over the runs that "
        "evaluated it there), mean over seeds, "
        "± 95% interval over seed x problem; change from "
        f"`{ref}` paired over (seed, problem).",
        "",
        "| variant | "
        + " | ".join(SETS)
        + " | "
        + " | ".join(f"{s} vs {ref}" for s in SETS)
        + " | minutes | peak GiB |",
        "|---|" + "---:|" * (2 * len(SETS) + 2),
    ]
    table: dict[str, Any] = {}
    for v in variants:
        cells, diffs, row = [], [], {}
        for name in SETS:
            values = [x for s in seeds for x in acc[v, s][name].values()]
            after_sft = [x for s in seeds for x in sft[v, s].get(name, {}).values()]
            m, h = mean_ci95(values)
            sft_mean = statistics.fmean(after_sft) if after_sft else None
            cells.append(
                f"{100 * m:.1f}% ± {100 * h:.1f}" + (f" ({100 * sft_mean:.1f}%)" if after_sft else "")
            )
            row[name] = {"final": m, "ci95": h, "after_sft": sft_mean}
            if v == ref:
                diffs.append("–")
                continue
            before = {(s, p): x for s in seeds for p, x in acc[ref, s][name].items()}
            after = {(s, p): x for s in seeds for p, x in acc[v, s][name].items()}
            d, dh, n = paired_change(before, after)
            diffs.append(f"{100 * d:+.1f} ± {100 * dh:.1f}")
            row[name] |= {"versus": d, "versus_ci95": dh, "pairs": n}
        runs = [costs.get(f"{v}-s{s}") for s in seeds]
        minutes = [c["seconds"] / 60 for c in runs if c]
        peak = [c["peak_gib"] for c in runs if c]
        row |= {"minutes": minutes, "peak_gib": peak}
        table[v] = row
        lines.append(
            f"| {v} | "
            + " | ".join(cells + diffs)
            + f" | {', '.join(f'{m:.0f}' for m in minutes) or '–'} | {', '.join(f'{p:.1f}' for p in peak) or '–'} |"
        )
    (out / "ablation.json").write_text(json.dumps({"seeds": seeds, "variants": table}, indent=2))
    text = "\n".join(lines) + "\n"
    (out / "ablation.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the imported SmolLM2 folder (rstar2 model import)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument(
        "--set", dest="overrides", action="append", default=[], help="a recipe override, KEY=VALUE"
    )
    ap.add_argument("--summary-only", action="store_true", help="summarize the finished runs, run nothing")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tree = yaml.safe_load(find_recipe("smollm2-135m").read_text())
    plan = [
        (v, int(s), variant_tree(tree, v, int(s), args.model, args.overrides))
        for s in args.seeds.split(",")
        for v in args.variants.split(",")
    ]
    costs_path = out / "costs.json"
    costs = json.loads(costs_path.read_text()) if costs_path.exists() else {}
    for v, s, t in [] if args.summary_only else plan:
        folder = out / f"{v}-s{s}"
        if (folder / "report.md").exists():
            continue
        print(f"[ablation] {v}, seed {s}", file=sys.stderr, flush=True)
        recipe = parse_recipe(t)
        resume = folder.exists() and any(folder.iterdir())
        cost = measured(lambda r=recipe, f=folder, res=resume: run_recipe(r, f, resume=res, progress=False))
        # read again: another ablation process on the same OUT (other variants) may have written
        costs = json.loads(costs_path.read_text()) if costs_path.exists() else {}
        costs[f"{v}-s{s}"] = cost
        costs_path.write_text(json.dumps(costs, indent=2))
    print(summarize(out, plan, costs))


if __name__ == "__main__":
    main()
