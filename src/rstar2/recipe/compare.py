"""``rstar2 compare``: GRPO-RoC against plain GRPO over seeds, from a finished recipe run's SFT
checkpoint (the paper's Fig. 4 question). Each variant runs the recipe's RL stages from it on the
same problems, once per seed, each (variant, seed) a recipe run in its own folder (so it resumes):
``roc`` as the recipe has it; ``grpo-kept``: plain GRPO sampling G and training on all (the paper's
baseline, Fig. 9); ``grpo-all``: plain GRPO on all 2G; ``roc-uniform``: as many correct and
incorrect kept as RoC keeps, at random (its downsampling without its choice); ``async-kK``: ``roc``
with rollouts up to K updates stale and the decoupled correction (``async-k4-none`` without it).
A lever of one's own is ``roc`` with recipe settings of its own (``levers``: a name and its
``KEY=VALUE`` overrides, ``rstar2 compare --lever``): a KL term, a learning rate, RoC's mode.
"""

from __future__ import annotations

import asyncio
import copy
import json
import multiprocessing
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..config_files import parse_config, set_value
from ..eval.metrics import per_problem_accuracy
from ..memory import peak_bytes, release_memory, reset_peak
from ..plots import pyplot, save_figure
from ..problems import source_name
from ..rollout.build import open_services
from ..rollout.stats import multiline_share, record
from ..rollout.trajectory import read_trajectories
from .curriculum import problem_rows
from .report_card import eval_dir, paired_change, percent, sampled_trajectories, stage_metrics
from .run import eval_rows, evaluate_model, run_recipe
from .spec import DataSpec, Recipe, moved_home, parse_recipe, stage_rollout, stage_tree
from .state import RecipeRun

DEFAULT_VARIANTS = ("roc", "grpo-kept", "grpo-all")
# the asynchronous variants: (asynchronous.max_staleness, loss.tis_cap: None is no correction)
ASYNC = {"async-k1": (1, 2.0), "async-k2": (2, 2.0), "async-k4": (4, 2.0), "async-k4-none": (4, None)}
# every variant (the module's docstring says what each is)
VARIANTS = ("roc", "grpo-kept", "grpo-all", "roc-uniform", *ASYNC)
# (metrics.jsonl key, title): the per-step curves, one PNG each
STEP_KEYS = (
    ("accuracy", "training accuracy (sampled)"),
    ("tools/error_ratio_correct_all", "tool-error ratio in correct rollouts (all)"),
    ("tools/error_ratio_correct_kept", "tool-error ratio in correct rollouts (kept)"),
    ("response/length_mean", "response tokens (mean)"),
    ("format/fault_share", "share of rollouts with a format fault"),
    ("tools/calls_per_traj", "tool calls per rollout"),
    ("tools/multiline_share", "tool calls of 2+ lines (all rollouts)"),
    ("tools/multiline_share_correct_kept", "tool calls of 2+ lines (correct, kept)"),
    ("groups/zero_spread_share", "groups without reward spread"),
    ("update/ref_kl", "KL to the stage's start"),
)
# the step metrics the summary table averages over each run's last steps
TAIL_KEYS = (
    "tools/error_ratio_correct_all",
    "tools/error_ratio_correct_kept",
    "response/length_mean",
    "format/fault_share",
)


@dataclass(frozen=True)
class Arm:
    """One run of the comparison: a variant at a seed, in its own folder."""

    variant: str
    seed: int
    folder: Path

    @property
    def name(self) -> str:
        return f"{self.variant}-s{self.seed}"


def source_run(source: Path) -> tuple[dict[str, Any], Path]:
    """A finished recipe run's recipe (as a tree) and its last SFT stage's checkpoint."""
    try:
        tree = moved_home(yaml.safe_load((source / "recipe.yaml").read_text()))
        state = json.loads((source / "recipe_state.json").read_text())
    except FileNotFoundError:
        raise ValueError(
            f"{source} is not a recipe run folder (no recipe.yaml / recipe_state.json)"
        ) from None
    sft = [s["name"] for s in tree.get("stages", []) if s.get("kind") == "sft"]
    rl = [s for s in tree.get("stages", []) if s.get("kind") == "rl"]
    if not sft or sft[-1] not in state.get("stages", {}):
        raise ValueError(f"{source}: the recipe has no finished SFT stage to start the comparison from")
    if not rl:
        raise ValueError(f"{source}: the recipe has no RL stage to compare")
    return tree, Path(state["stages"][sft[-1]]["checkpoint"])


def arm_tree(
    tree: dict[str, Any],
    checkpoint: Path,
    variant: str,
    seed: int,
    overrides: Sequence[str] = (),
    stages: Sequence[str] | None = None,
    levers: dict[str, Sequence[str]] | None = None,
) -> dict:
    """The recipe of one arm: its RL stages (all, or ``stages``) from ``checkpoint`` with the variant's
    settings and ``run.seed``, evaluated after the stages only (no zero-shot, no entropy analysis).
    A variant named in ``levers`` is ``roc`` with its overrides, set after ``overrides``."""
    own = (levers or {}).get(variant)
    t = copy.deepcopy(tree)
    model = {k: v for k, v in t["model"].items() if k not in ("source", "build")}
    t["model"] = {**model, "path": str(checkpoint)}
    rl = [s for s in t["stages"] if s.get("kind") == "rl"]
    if stages is not None:
        unknown = [n for n in stages if n not in {s["name"] for s in rl}]
        if unknown or not stages:
            raise ValueError(f"--stages {list(stages)}: the recipe's RL stages are {[s['name'] for s in rl]}")
        rl = [s for s in rl if s["name"] in stages]
    t["stages"] = rl
    t["eval"] = {**t.get("eval", {}), "before": False, "plain_before": False, "entropy_trajectories": 0}
    rl = t.setdefault("defaults", {}).setdefault("rl", {})
    rl["run"] = {**rl.get("run", {}), "seed": seed}
    t["name"] = f"{t.get('name', 'recipe')}-{variant}-s{seed}"
    for o in [*overrides, *(own or ())]:
        set_value(t, o)
    resolved = parse_recipe(t, check_paths=False)  # each stage's samples and keep as its run sees them
    for stage, spec in zip(t["stages"], resolved.stages, strict=True):
        run = parse_config(stage_tree(resolved, spec, model_path=str(checkpoint), train="-", out="-"))
        apply_variant(
            stage, "roc" if own is not None else variant, samples=run.rollout.samples, keep=run.roc.keep
        )
    return t


def apply_variant(stage: dict, variant: str, *, samples: int, keep: int) -> None:
    """Set ``variant``'s settings on the stage itself, so that none of its own undoes them;
    ``samples`` (2G) and ``keep`` (G): the stage's resolved settings."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: choose from {', '.join(VARIANTS)}")
    roc = dict(stage.get("roc") or {})
    if variant == "roc" or variant in ASYNC:
        roc["enabled"] = True
    elif variant == "roc-uniform":
        roc.update(enabled=True, mode="uniform")
    else:
        roc["enabled"] = False
        sampled = keep if variant == "grpo-kept" else samples
        stage["rollout"] = {**stage.get("rollout", {}), "samples": sampled}
    stage["roc"] = roc
    if variant in ASYNC:
        k, tis_cap = ASYNC[variant]
        stage["asynchronous"] = {**stage.get("asynchronous", {}), "max_staleness": k}
        stage["loss"] = {**stage.get("loss", {}), "tis_cap": tis_cap}


def parse_lever(text: str) -> tuple[str, list[str]]:
    """``NAME:KEY=VALUE[;KEY=VALUE...]`` (``--lever``) → the name and its overrides."""
    name, _, sets = text.partition(":")
    overrides = [o.strip() for o in sets.split(";") if o.strip()]
    name = name.strip()
    if not name or name in VARIANTS or not overrides or any("=" not in o for o in overrides):
        raise ValueError(
            f"--lever {text!r}: write NAME:KEY=VALUE[;KEY=VALUE...] with a name of your own "
            f"(not one of {', '.join(VARIANTS)}), e.g. 'kl:defaults.rl.loss.kl_coef=0.05'"
        )
    return name, overrides


def arms(
    out: Path, variants: Sequence[str], seeds: Sequence[int], levers: dict[str, Sequence[str]] | None = None
) -> list[Arm]:
    unknown = [v for v in variants if v not in VARIANTS and v not in (levers or {})]
    if unknown:
        raise ValueError(
            f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}, or name a lever of your own"
        )
    # seeds outermost: a stop part-way leaves whole seeds of every variant
    return [Arm(v, s, out / f"{v}-s{s}") for s in seeds for v in variants]


# -- running ------------------------------------------------------------------------------------
def _finished(folder: Path) -> bool:
    return (folder / "report.md").exists()


def run_comparison(
    source: str | Path,
    out: str | Path,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    variants: Sequence[str] = DEFAULT_VARIANTS,
    overrides: Sequence[str] = (),
    stages: Sequence[str] | None = None,
    levers: dict[str, Sequence[str]] | None = None,
    parallel: int = 1,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> Path:
    """Run every arm not yet finished (the SFT checkpoint's evaluation first); returns ``compare.md``.
    ``levers``: variants of one's own, each ``roc`` with its overrides (a lever not in ``variants``
    runs after them). ``parallel`` > 1: that many arms at once, each in a process of its own (a GPU
    that a small model leaves idle most of the time, or a machine of many cores)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per weight load would drown the runs' own lines
    source, out = Path(source), Path(out)
    tree, checkpoint = source_run(source)
    levers = {k: list(v) for k, v in (levers or {}).items()}
    variants = list(dict.fromkeys([*variants, *levers]))
    plan = arms(out, variants, seeds, levers)
    recipes = {
        a.name: parse_recipe(arm_tree(tree, checkpoint, a.variant, a.seed, overrides, stages, levers))
        for a in plan
    }
    out.mkdir(parents=True, exist_ok=True)
    asked = dict(source=str(source), checkpoint=str(checkpoint), seeds=list(seeds), variants=variants)
    asked.update(overrides=list(overrides), stages=None if stages is None else list(stages), levers=levers)
    (out / "comparison.yaml").write_text(yaml.safe_dump(asked, sort_keys=False))
    costs_file = out / "costs.json"
    costs = json.loads(costs_file.read_text()) if costs_file.exists() else {}
    first = recipes[plan[0].name]
    shown = progress and parallel <= 1  # bars of several processes would overwrite each other
    jobs: list[tuple[str, Callable[..., dict[str, float]], tuple]] = []
    if "sft" not in costs:
        jobs.append(("sft", _evaluation_job, (first, checkpoint, out / "sft", shown)))
    for arm in plan:
        if not _finished(arm.folder):
            resume = arm.folder.exists() and any(arm.folder.iterdir())
            jobs.append((arm.name, _arm_job, (recipes[arm.name], arm.folder, resume, shown)))

    def done(name: str, cost: dict[str, float]) -> None:
        costs[name] = cost
        costs_file.write_text(json.dumps(costs, indent=2))

    if parallel <= 1:
        for n, (name, job, args) in enumerate(jobs, 1):
            log(f"[rstar2] compare: {n}/{len(jobs)}: {name}")
            done(name, job(*args))
    else:
        log(f"[rstar2] compare: {len(jobs)} runs, {parallel} at a time: {', '.join(j[0] for j in jobs)}")
        context = multiprocessing.get_context("spawn")  # no copy of this process's threads or device
        with ProcessPoolExecutor(parallel, mp_context=context) as pool:
            running = {pool.submit(job, *args): name for name, job, args in jobs}
            try:
                for future in as_completed(running):
                    done(running[future], future.result())
                    log(f"[rstar2] compare: {running[future]} finished")
            except BaseException:  # as one at a time: no run starts after one failed
                pool.shutdown(cancel_futures=True)
                raise
    return write_summary(out, first, plan, costs)


def _evaluation_job(recipe: Recipe, checkpoint: Path, folder: Path, progress: bool) -> dict[str, float]:
    return measured(lambda: asyncio.run(evaluate_start(recipe, checkpoint, folder, progress)))


def _arm_job(recipe: Recipe, folder: Path, resume: bool, progress: bool) -> dict[str, float]:
    return measured(run_recipe, recipe, folder, resume=resume, progress=progress, log=print)


def measured(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, float]:
    """``fn(*args, **kwargs)``'s wall seconds and this process's peak resident memory (GiB)."""
    release_memory()
    reset_peak()
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    cost = {"seconds": time.perf_counter() - t0, "peak_gib": peak_bytes() / 2**30}
    release_memory()
    return cost


async def evaluate_start(recipe: Recipe, checkpoint: Path, folder: Path, progress: bool) -> None:
    """The SFT checkpoint on the held-out problems and every ``eval.also`` set, as the arms' final
    evaluations sample (``folder/heldout``, ``folder/<set>``)."""
    sets = {"heldout": eval_rows(recipe)}
    sets.update({source_name(n): problem_rows(DataSpec(files=[n]), recipe.seed) for n in recipe.eval.also})
    async with open_services(stage_rollout(recipe)) as services:
        run = RecipeRun(recipe, folder, progress, services=services)
        for name, rows in sets.items():
            if rows:
                await evaluate_model(run, checkpoint, rows, folder / name)


# -- summarizing --------------------------------------------------------------------------------
def figures_in(out_dir: Path) -> tuple[dict[Any, float], float]:
    """An evaluation's per-problem accuracy and the share of its tool calls with two or more lines,
    from one read of its trajectories."""
    trajs, _ = read_trajectories(sampled_trajectories(out_dir))
    return per_problem_accuracy(trajs), multiline_share([record(t) for t in trajs])


def summarize(out: Path, recipe: Recipe, plan: Sequence[Arm]) -> dict[str, Any]:
    """Per variant: every finished seed's step curves, final accuracy (mean and spread over seeds),
    its paired change from the SFT checkpoint, and the first variant's paired difference from each."""
    index, last = len(recipe.stages), recipe.stages[-1].name  # the evaluations after the last stage
    labels = {"heldout": last, **{source_name(s): f"{last}-{source_name(s)}" for s in recipe.eval.also}}
    sets = list(labels)
    start_figures = {s: figures_in(out / "sft" / s) for s in sets} if (out / "sft").exists() else {}
    variants: dict[str, Any] = {}
    finals: dict[str, dict[str, dict[Any, float]]] = {}
    for v in dict.fromkeys(a.variant for a in plan):
        finished = [a for a in plan if a.variant == v and _finished(a.folder)]
        if not finished:
            continue
        figures = [
            {s: figures_in(eval_dir(a.folder, index, label)) for s, label in labels.items()} for a in finished
        ]
        steps = {a.seed: [r for _, rows in stage_metrics(a.folder, recipe) for r in rows] for a in finished}
        entry: dict[str, Any] = {"seeds": [a.seed for a in finished], "steps": steps, "final": {}}
        for s in sets:
            accs = [f[s][0] for f in figures]
            per_seed = [sum(acc.values()) / max(1, len(acc)) for acc in accs]
            common = set.intersection(*(set(acc) for acc in accs))  # the problems every seed evaluated
            mean_acc = {p: sum(acc[p] for acc in accs) / len(accs) for p in common}
            finals.setdefault(v, {})[s] = mean_acc
            row = {
                "per_seed": per_seed,
                "mean": statistics.fmean(per_seed),
                "sd": statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0,
                "multiline": statistics.fmean(f[s][1] for f in figures),
            }
            if s in start_figures:
                start, row["multiline_start"] = start_figures[s]
                if start:
                    change, half, n = paired_change(start, mean_acc)
                    row.update(
                        start=sum(start.values()) / len(start), change=change, change_ci95=half, paired=n
                    )
            entry["final"][s] = row
        variants[v] = entry
    first = next(iter(finals), None)  # the reference: the first variant asked for (roc by default)
    versus = {}
    for v in list(finals)[1:]:
        changes = {s: paired_change(finals[v][s], finals[first][s]) for s in sets}
        versus[v] = {s: {"minus": m, "ci95": h, "paired": n} for s, (m, h, n) in changes.items()}
    return {"sets": sets, "variants": variants, "reference": first, "versus": versus}


def _tail_mean(rows: list[dict[str, Any]], key: str, last: int = 5) -> float | None:
    vals = [r[key] for r in rows[-last:] if isinstance(r.get(key), (int, float))]
    return sum(vals) / len(vals) if vals else None


def write_summary(out: Path, recipe: Recipe, plan: Sequence[Arm], costs: dict[str, Any]) -> Path:
    summary = summarize(out, recipe, plan)
    pngs = plot_steps(out, summary)
    name = recipe.name.removesuffix(f"-{plan[0].name}")  # the first arm's recipe, RECIPE-VARIANT-sSEED
    lines = [
        f"# RL variants over seeds: {name} ({', '.join(dict.fromkeys(a.variant for a in plan))})",
        "",
        "Each variant runs the recipe's RL stages from the same SFT checkpoint, once per seed. Accuracy "
        "after the stages: mean ± standard deviation over seeds; change from the SFT checkpoint and "
        "the first variant's difference from the others: problems paired, accuracy averaged over seeds, "
        "± a 95% interval.",
        "",
    ]
    sets = summary["sets"]
    head = "| variant | seeds | " + " | ".join(f"{x} | {x}: change from SFT" for x in sets)
    head += " | tool-error ratio in correct, all / kept (last 5 steps) | response tokens | format faults | minutes a run | peak GiB |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for v, entry in summary["variants"].items():
        lines.append(
            _variant_row(v, entry, sets, [costs[a.name] for a in plan if a.variant == v and a.name in costs])
        )
    lines += [
        "",
        "Tool calls of two or more lines after the stages (after SFT in brackets), mean over seeds:",
        "",
        "| variant | " + " | ".join(sets) + " |",
        "|---|" + "---|" * len(sets),
    ]
    for v, entry in summary["variants"].items():
        cells = []
        for x in sets:
            f = entry["final"][x]
            start = f" ({percent(f['multiline_start'])})" if "multiline_start" in f else ""
            cells.append(f"{percent(f['multiline'])}{start}")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    for v, by_set in summary["versus"].items():
        differences = ", ".join(
            f"{x} {100 * d['minus']:+.1f} ± {100 * d['ci95']:.1f} points (paired over {d['paired']})"
            for x, d in by_set.items()
        )
        lines += ["", f"{summary['reference']} minus {v}: {differences}."]
    total = sum(c["seconds"] for c in costs.values())
    lines += ["", f"Time spent: {total / 60:.1f} min over {len(costs)} runs (the SFT evaluation included)."]
    lines += [""] + [f"![{p.stem}]({p.name})" for p in pngs]
    path = out / "compare.md"
    path.write_text("\n".join(lines) + "\n")
    (out / "compare.json").write_text(json.dumps({**summary, "costs": costs}, indent=1, default=str))
    return path


def _variant_row(variant: str, entry: dict[str, Any], sets: list[str], spent: list[dict[str, float]]) -> str:
    """A variant's row of ``write_summary``'s table; ``spent``: its runs' costs."""
    cells = [variant, str(len(entry["seeds"]))]
    for x in sets:
        f = entry["final"][x]
        cells.append(f"{percent(f['mean'])} ± {100 * f['sd']:.1f}")
        cells.append(
            f"{100 * f['change']:+.1f} ± {100 * f['change_ci95']:.1f} (from {percent(f['start'])})"
            if "change" in f
            else "–"
        )
    tails = {
        k: [t for t in (_tail_mean(r, k) for r in entry["steps"].values()) if t is not None]
        for k in TAIL_KEYS
    }
    avg = {k: (sum(v) / len(v) if v else None) for k, v in tails.items()}
    length = avg["response/length_mean"]
    cells += [
        f"{percent(avg['tools/error_ratio_correct_all'])} / {percent(avg['tools/error_ratio_correct_kept'])}",
        "–" if length is None else f"{length:.1f}",
        percent(avg["format/fault_share"]),
        f"{statistics.fmean(c['seconds'] for c in spent) / 60:.1f}" if spent else "–",
        f"{max(c['peak_gib'] for c in spent):.1f}" if spent else "–",
    ]
    return "| " + " | ".join(cells) + " |"


def plot_steps(out: Path, summary: dict[str, Any]) -> list[Path]:
    """One PNG per step metric: each variant's mean over seeds, its min-max band shaded."""
    plt = pyplot()
    paths = []
    for key, title in STEP_KEYS:
        fig, ax = plt.subplots(figsize=(5.2, 3.4))
        drawn = False
        for v, entry in summary["variants"].items():
            curves = [
                {r["step"]: r[key] for r in rows if isinstance(r.get(key), (int, float))}
                for rows in entry["steps"].values()
            ]
            steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if not steps:
                continue
            vals = [[c[t] for c in curves] for t in steps]
            ax.plot(steps, [statistics.fmean(x) for x in vals], label=f"{v} ({len(curves)} seeds)")
            ax.fill_between(steps, [min(x) for x in vals], [max(x) for x in vals], alpha=0.2)
            drawn = True
        if drawn:
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("RL step (all stages)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            paths.append(save_figure(fig, out / f"compare_{key.replace('/', '_')}.png"))
        else:
            plt.close(fig)
    return paths
