"""The report of a recipe run: a Markdown table per evaluation and PNG curves per step and stage."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from ..eval.metrics import mean_ci95, per_problem_accuracy
from ..plots import pyplot, save_figure
from ..problems import source_name
from ..rl.run.metrics_log import read_metrics
from ..rollout.health import SIGNS, read_warnings
from ..rollout.trajectory import read_trajectories

# (metrics.jsonl key, title) of the per-step curves; SFT stages contribute their loss.
STEP_KEYS = (
    ("accuracy", "training accuracy (sampled)"),
    ("tools/error_ratio_correct_all", "tool-error ratio in correct"),
    ("response/length_mean", "response tokens (mean)"),
    ("response/truncated_share", "share truncated"),
    ("loss", "loss"),
)
# (eval summary key, title) of the per-stage plot.
EVAL_KEYS = (
    ("pass@1", "held-out accuracy (pass@1)"),
    ("tool_error_ratio_correct", "tool-error ratio in correct"),
    ("mean_response_tokens", "response tokens (mean)"),
    ("truncated_share", "share truncated"),
)


def percent(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "–"


def eval_row(summary: dict[str, Any]) -> dict[str, Any]:
    n = max(1, summary.get("trajectories", 0))
    finishes = summary.get("finish_reasons", {})
    return {
        "pass@1": summary.get("pass@1"),
        "ci95": summary.get("pass@1_ci95"),
        "tool_error_ratio_correct": summary.get("tool_error_ratio_correct"),
        "tool_multiline_share": summary.get("tool_multiline_share"),
        "mean_response_tokens": summary.get("mean_response_tokens"),
        "truncated_share": finishes.get("max_length", 0) / n,
        "finish_reasons": finishes,
    }


def table(evals: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| after | held-out accuracy | tool-error ratio in correct | tool calls of 2+ lines | mean response tokens "
        "| truncated | finish reasons |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, summary in evals.items():
        r = eval_row(summary)
        ci = f" ± {100 * r['ci95']:.1f}" if isinstance(r["ci95"], (int, float)) else ""
        finishes = ", ".join(f"{k} {v}" for k, v in sorted(r["finish_reasons"].items()))
        tokens = r["mean_response_tokens"]
        lines.append(
            f"| {name} | {percent(r['pass@1'])}{ci} | {percent(r['tool_error_ratio_correct'])} | "
            f"{percent(r['tool_multiline_share'])} | {tokens:.1f} | {percent(r['truncated_share'])} | {finishes} |"
            if isinstance(tokens, (int, float))
            else f"| {name} | – | – | – | – | – | – |"
        )
    return "\n".join(lines)


def eval_dir(out: Path, index: int, name: str) -> Path:
    """Where a recipe run keeps the held-out evaluation after its ``index``-th stage (0: before any)."""
    return out / "eval" / f"{index:02d}-{name}"


def sampled_trajectories(out_dir: Path) -> Path:
    """Where sampling ``problems.jsonl`` into ``out_dir`` leaves its trajectories (eval's folder a file)."""
    return out_dir / "problems" / "trajectories.jsonl"


def accuracy_in(out_dir: Path) -> dict[Any, float]:
    return per_problem_accuracy(read_trajectories(sampled_trajectories(out_dir))[0])


def stage_metrics(out: Path, recipe: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each stage's name and step metrics (``metrics.jsonl``; none for a stage not run), its steps
    numbered on from the stages before."""
    stages: list[tuple[str, list[dict[str, Any]]]] = []
    end = 0
    for n, s in enumerate(recipe.stages, 1):
        f = out / f"{n:02d}-{s.name}" / "metrics.jsonl"
        rows = [{**r, "step": end + r["step"]} for r in (read_metrics(f) if f.exists() else [])]
        stages.append((s.name, rows))
        end = max((r["step"] for r in rows), default=end)
    return stages


def paired_change(before: dict[Any, float], after: dict[Any, float]) -> tuple[float, float, int]:
    """Mean change of per-problem accuracy over the problems both hold, and its 95% half-width:
    pairing each problem with itself removes the spread in difficulty from the interval."""
    common = before.keys() & after.keys()
    if not common:
        raise ValueError("no problem was evaluated both times")
    mean, half = mean_ci95([after[p] - before[p] for p in common])
    return mean, half, len(common)


def _change(before: Path, after: Path, pairs: str = "") -> str | None:
    """The paired change of per-problem accuracy from one evaluation folder to another, in words
    (``pairs``: what the pairs are called); None unless both hold trajectories."""
    if not (sampled_trajectories(before).exists() and sampled_trajectories(after).exists()):
        return None
    change, half, n = paired_change(accuracy_in(before), accuracy_in(after))
    return f"{100 * change:+.1f} points, 95% interval ± {100 * half:.1f} (paired over {n}{pairs})"


def rl_gain(out: Path, recipe: Any, evals: dict[str, Any]) -> str | None:
    """One sentence: held-out accuracy before the first RL stage and after the last, and the change."""
    names = [s.name for s in recipe.stages]
    rl = [i for i, s in enumerate(recipe.stages) if s.kind == "rl"]
    if not rl:
        return None
    first, last = rl[0], rl[-1]
    before = (names[first - 1], first) if first else ("start", 0)
    after = (names[last], last + 1)
    if before[0] not in evals or after[0] not in evals:
        return None
    if (change := _change(*(eval_dir(out, n, name) for name, n in (before, after)), " problems")) is None:
        return None
    a, b = evals[before[0]]["pass@1"], evals[after[0]]["pass@1"]
    return (
        f"RL ({', '.join(names[i] for i in rl)}) took held-out accuracy from {percent(a)} (after {before[0]}) "
        f"to {percent(b)} (after {after[0]}): {change}."
    )


def also_changes(out: Path, recipe: Any, name: str, by_model: dict[str, Any]) -> list[str]:
    """Paired changes on an ``eval.also`` set from each earlier evaluation to the last one."""
    index = {"start": 0, "start-plain": 0} | {s.name: n for n, s in enumerate(recipe.stages, 1)}
    labels = [label for label in by_model if label in index]
    if len(labels) < 2:
        return []
    folders = {label: eval_dir(out, index[label], f"{label}-{source_name(name)}") for label in labels}
    *earlier, last = labels
    changes = [(label, _change(folders[label], folders[last])) for label in earlier]
    return [f"from {label} to {last}: {change}" for label, change in changes if change is not None]


def health_section(
    out: Path, recipe: Any, stages: list[tuple[str, list[dict[str, Any]]]]
) -> tuple[list[str], list[dict[str, Any]]]:
    """The report's lines on tool-use health (each RL stage's mean and worst share of each sign, the
    first ten warnings; none without RL steps), and every warning."""
    table = [
        "| stage | " + " | ".join(f"{words} (mean / worst)" for words in SIGNS.values()) + " | warnings |",
        "|---|" + "---|" * (len(SIGNS) + 1),
    ]
    warnings = []
    for n, (stage, (name, rows)) in enumerate(zip(recipe.stages, stages, strict=True), 1):
        if stage.kind != "rl" or not rows:
            continue
        stage_warnings = read_warnings(out / f"{n:02d}-{name}")
        warnings += [{"stage": name, **w} for w in stage_warnings]
        cells = []
        for sign in SIGNS:
            vals = [r[f"health/{sign}"] for r in rows if isinstance(r.get(f"health/{sign}"), (int, float))]
            cells.append(f"{percent(sum(vals) / len(vals))} / {percent(max(vals))}" if vals else "–")
        table.append(f"| {name} | " + " | ".join(cells) + f" | {len(stage_warnings)} |")
    if len(table) == 2:
        return [], warnings
    lines = ["", "Tool-use health of the RL stages (share of a step's rollouts; limits in `run.health`):", ""]
    lines += [*table, ""] + [f"- warning, {w['stage']}: {w['message']}" for w in warnings[:10]]
    if len(warnings) > 10:
        lines.append(f"- … and {len(warnings) - 10} more (each stage's `health.jsonl`)")
    return lines, warnings


def _plot_steps(out: Path, stages: list[tuple[str, list[dict[str, Any]]]]) -> Path | None:
    keys = [(k, t) for k, t in STEP_KEYS if any(k in r for _, rows in stages for r in rows)]
    if not keys:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(4.0 * len(keys), 3.2), squeeze=False)
    end = 0
    for name, rows in stages:
        for ax, (k, _) in zip(axes.flat, keys, strict=True):
            pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
            if pts:
                ax.plot(*zip(*pts, strict=True), label=name, marker="." if len(pts) < 50 else None)
        end = max((r["step"] for r in rows), default=end)
        for ax in axes.flat:
            ax.axvline(end, color="grey", lw=0.5, ls=":")
    for ax, (_, title) in zip(axes.flat, keys, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step (all stages)")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    return save_figure(fig, out / "report_steps.png")


def _plot_evals(out: Path, evals: dict[str, dict[str, Any]]) -> Path | None:
    if not evals:
        return None
    plt = pyplot()
    names = list(evals)
    rows = [eval_row(evals[n]) for n in names]
    fig, axes = plt.subplots(1, len(EVAL_KEYS), figsize=(4.0 * len(EVAL_KEYS), 3.2), squeeze=False)
    for ax, (k, title) in zip(axes.flat, EVAL_KEYS, strict=True):
        vals = [r[k] if isinstance(r[k], (int, float)) else 0.0 for r in rows]
        ax.bar(range(len(names)), vals, color="tab:blue")
        if k == "pass@1":
            ax.errorbar(range(len(names)), vals, yerr=[r["ci95"] or 0.0 for r in rows], fmt="none", color="k")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, out / "report_stages.png")


def write_report(out: Path, recipe: Any, state: dict[str, Any]) -> Path:
    """``report.md`` (+ ``report.json``, ``report_steps.png``, ``report_stages.png``) in ``out``."""
    stages = stage_metrics(out, recipe)
    evals = state.get("evals", {})
    gain = rl_gain(out, recipe, evals)
    health, warned = health_section(out, recipe, stages)
    lines = [
        *_results(out, recipe, state, gain),
        *_stage_table(recipe, state, stages),
        *health,
        *_links(out, [_plot_evals(out, evals), _plot_steps(out, stages)]),
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = {
        "evals": {k: eval_row(v) for k, v in evals.items()},
        "also": {s: {k: eval_row(v) for k, v in e.items()} for s, e in state.get("also", {}).items()},
        "rl_gain": gain,
        "stages": state.get("stages", {}),
        "health_warnings": warned,
    }
    (out / "report.json").write_text(json.dumps(summary, indent=2))
    return path


def _results(out: Path, recipe: Any, state: dict[str, Any], gain: str | None) -> list[str]:
    """The report's head: the evaluations' table, the RL gain, each ``eval.also`` set's table."""
    lines = [
        f"# {recipe.name}: recipe report",
        "",
        f"Held-out problems: {out / 'heldout.jsonl'} ({recipe.eval.samples} samples each at temperature "
        f"{recipe.eval.temperature}); ± is a 95% interval over problems.",
        "",
    ]
    if state.get("precision"):
        from ..device import Precision

        lines += [f"Training passes: {Precision(**state['precision']).describe()}.", ""]
    lines += [table(state.get("evals", {})), ""]
    if gain:
        lines += [gain, ""]
    for name, by_model in state.get("also", {}).items():
        if by_model:  # eval.also: the same models on another set (e.g. new wording)
            lines += [f"On `{name}`:", "", table(by_model).replace("held-out accuracy", "accuracy", 1), ""]
            changes = also_changes(out, recipe, name, by_model)
            if changes:
                lines += [f"Change on `{name}`: " + "; ".join(changes) + ".", ""]
    return lines


def _stage_table(
    recipe: Any, state: dict[str, Any], stages: list[tuple[str, list[dict[str, Any]]]]
) -> list[str]:
    """Each stage's steps and checkpoint; an RL stage's share of tool calls of two or more lines in
    its first and last step's rollouts (the programs SFT taught, kept or unlearned)."""
    lines = [
        "| stage | kind | steps | stopped early | tool calls of 2+ lines (first → last step) | checkpoint |",
        "|---|---|---|---|---|---|",
    ]
    for stage, (_, rows) in zip(recipe.stages, stages, strict=True):
        s = state.get("stages", {}).get(stage.name, {})
        shares = [r["tools/multiline_share"] for r in rows if "tools/multiline_share" in r]
        programs = f"{percent(shares[0])} → {percent(shares[-1])}" if shares else "–"
        lines.append(
            f"| {stage.name} | {stage.kind} | {s.get('steps', '–')} | {s.get('stopped_early', '–')} | "
            f"{programs} | {s.get('checkpoint', 'not run')} |"
        )
    return lines


def _links(out: Path, pngs: list[Path | None]) -> list[str]:
    """The plots, the trajectory viewer (``rstar2 view``) and the entropy analysis the run has."""
    from ..analysis.view import view

    found = [f"![{png.stem}]({png.name})" for png in pngs if png is not None]
    with contextlib.suppress(FileNotFoundError):  # the run has no trajectories
        view(out, out / "view.html")
        found.append(
            "Trajectories (held-out evaluations, RL samples with RoC's choices): [view.html](view.html)"
        )
    if (out / "entropy" / "entropy.md").exists():
        found.append(
            "Token entropy of the final model (reasoning, reflection after tool responses, code, answer): "
            "[entropy/entropy.md](entropy/entropy.md), tokens coloured by entropy: "
            "[entropy/tokens.html](entropy/tokens.html)"
        )
    return [line for block in found for line in ("", block)]
