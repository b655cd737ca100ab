"""Scores of sampled trajectories: pass@1 averaged over k samples, pass@k, maj@k, and how the
model got there (lengths, tool calls, tool errors, finish reasons). Pure functions."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from ..reward.normalize import normalize
from ..rollout.stats import describe, record
from ..rollout.trajectory import Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from n samples with c correct
    (Chen et al., 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% normal interval (over problems)."""
    if not values:
        return 0.0, 0.0
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, 0.0
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, 1.96 * math.sqrt(var / len(values))


def majority_correct(samples: Sequence[tuple[str | None, bool]]) -> bool:
    """maj@k for one problem: the most frequent extracted answer (ties: the one seen first) and
    whether it is right; samples without an answer do not vote."""
    votes: Counter[str] = Counter()
    right: dict[str, bool] = {}
    for answer, correct in samples:
        if answer is None:
            continue
        key = normalize(answer)
        votes[key] += 1
        right.setdefault(key, correct)
    # most_common keeps first-seen order among equal counts
    return right[votes.most_common(1)[0][0]] if votes else False


def group_by_problem(trajs: Iterable[Trajectory]) -> dict[Any, list[Trajectory]]:
    groups: dict[Any, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        groups[t.meta.get("problem_index", t.problem)].append(t)
    for g in groups.values():
        g.sort(key=lambda t: t.meta.get("sample", 0))
    return dict(groups)


def per_problem_accuracy(trajs: Iterable[Trajectory]) -> dict[Any, float]:
    """Share of correct samples per problem (keyed as ``group_by_problem`` keys them)."""
    return {key: sum(t.correct for t in g) / len(g) for key, g in group_by_problem(trajs).items()}


def mean_pass_at_k(groups: dict[Any, list[Trajectory]], k: int) -> float:
    return sum(pass_at_k(len(g), sum(t.correct for t in g), k) for g in groups.values()) / len(groups)


def summarize(trajs: Sequence[Trajectory], ks: Sequence[int] = (1, 4, 8, 16)) -> dict[str, Any]:
    """Everything `rstar2 eval` reports for one benchmark."""
    groups = group_by_problem(trajs)
    if not groups:
        return {"problems": 0, "samples": 0}
    n_min = min(len(g) for g in groups.values())
    avg, ci = mean_ci95(list(per_problem_accuracy(trajs).values()))
    out: dict[str, Any] = {
        "problems": len(groups),
        "samples": n_min,
        "trajectories": len(trajs),
        "pass@1": avg,
        "pass@1_ci95": ci,
    }
    for k in ks:
        if 1 < k <= n_min:
            out[f"pass@{k}"] = mean_pass_at_k(groups, k)
            out[f"maj@{k}"] = sum(
                majority_correct([(t.answer, t.correct) for t in g[:k]]) for g in groups.values()
            ) / len(groups)
    d = describe([record(t) for t in trajs])
    out.update(
        mean_response_tokens=d["length_mean"],
        mean_turns=d["turns_mean"],
        tool_calls_per_trajectory=d["calls_per_traj"],
        tool_error_ratio=d["error_ratio"],
        tool_error_ratio_correct=d["error_ratio_correct"],
        tool_multiline_share=d["multiline_share"],
        finish_reasons=dict(d["finishes"]),
        tool_statuses=dict(Counter(c.status for t in trajs for c in t.calls)),
        tool_health=d["health"],  # shares of trajectories showing each sign (rollout/health.py)
    )
    return out
