"""What a person reads after an evaluation: a Markdown table and one PNG per benchmark."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..plots import pyplot, save_figure
from ..rollout.trajectory import Trajectory
from .metrics import group_by_problem, mean_pass_at_k


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def summary_markdown(summaries: dict[str, dict[str, Any]], settings: dict[str, Any]) -> str:
    lines = ["# Evaluation", ""]
    if settings:
        lines += ["Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]
    lines += [
        "| benchmark | problems | samples | pass@1 (%) ± 95% CI | pass@k (%) | maj@k (%) | mean tokens | calls/traj | tool errors (%) | finish reasons |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summaries.items():
        if not s.get("problems"):
            lines.append(f"| {name} | 0 | – | – | – | – | – | – | – | – |")
            continue
        k = s["samples"]
        finish = ", ".join(f"{r} {n}" for r, n in sorted(s["finish_reasons"].items()))
        lines.append(
            f"| {name} | {s['problems']} | {k} | {_pct(s['pass@1'])} ± {_pct(s['pass@1_ci95'])} "
            f"| {_pct(s.get(f'pass@{k}'))} | {_pct(s.get(f'maj@{k}'))} | {s['mean_response_tokens']:.0f} "
            f"| {s['tool_calls_per_trajectory']:.2f} | {_pct(s['tool_error_ratio'])} | {finish} |"
        )
    lines += ["", "pass@k and maj@k use all k samples per problem (k = samples); pass@1 is avg@k."]
    return "\n".join(lines) + "\n"


def plot_benchmark(name: str, trajs: Sequence[Trajectory], path: Path, ks: Sequence[int]) -> Path | None:
    """pass@k over k, response lengths of right and wrong answers, and finish reasons."""
    if not trajs:
        return None
    plt = pyplot()
    groups = group_by_problem(trajs)
    n_min = min(len(g) for g in groups.values())
    ks = [k for k in ks if k <= n_min] or [1]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(ks, [100 * mean_pass_at_k(groups, k) for k in ks], marker="o")
    axes[0].set(xlabel="k", ylabel="pass@k (%)", title=f"{name}: pass@k", ylim=(0, 100))
    axes[0].set_xscale("log", base=2)
    right = [t.response_tokens for t in trajs if t.correct]
    wrong = [t.response_tokens for t in trajs if not t.correct]
    axes[1].hist(
        [right, wrong], bins=20, stacked=True, label=["correct", "incorrect"], color=["tab:green", "tab:red"]
    )
    axes[1].set(xlabel="response tokens", ylabel="trajectories", title="response length")
    axes[1].legend()
    reasons = Counter(t.finish_reason for t in trajs)
    axes[2].bar(list(reasons), list(reasons.values()), color="tab:blue")
    axes[2].set(ylabel="trajectories", title="finish reasons")
    return save_figure(fig, path, dpi=100)
