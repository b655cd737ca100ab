"""What one RL step logs of its rollouts and engines: pure functions over small records, so
processes can exchange them and a test can check them by hand."""

from __future__ import annotations

from collections import Counter
from typing import Any, get_args

from ...rollout import stats
from ...rollout.trajectory import FinishReason, Trajectory
from ..algorithm.roc import Scored

FINISH_REASONS = get_args(FinishReason)
FAULT_KINDS = ("engine", "sandbox", "verifier")


def rollout_record(t: Trajectory, kept: bool, scored: Scored | None) -> dict[str, Any]:
    """What the metrics need of one rollout: RoC's choice and penalties (None: a fault left it out)."""
    return {
        **stats.record(t),
        # the problem's group in the step and, for generated or reasoning-gym problems, its task
        "group": t.meta.get("group"),
        "family": t.meta.get("family"),
        "level": t.meta.get("level"),
        "kept": kept,
        "p_err": scored.p_err if scored else 0.0,
        "p_format": scored.p_format if scored else 0.0,
        "tool_s": sum(turn.tool_s for turn in t.turns),
        "reward_s": float(t.meta.get("reward_s", 0.0)),
        "fault": t.fault,
    }


def step_metrics(all_records: list[dict[str, Any]]) -> dict[str, float]:
    """Accuracy, lengths, finishes and tools of the rollouts not spoiled; ``faults/*``: shares by kind."""
    faults = Counter(r["fault"] for r in all_records if r["fault"])
    faulted = {f"faults/{kind}": faults[kind] / max(1, len(all_records)) for kind in FAULT_KINDS}
    records = [r for r in all_records if not r["fault"]]
    n = max(1, len(records))
    d = stats.describe(records)
    finishes = d["finishes"]
    correct = [r for r in records if r["correct"]]
    kept = [r for r in correct if r["kept"]]
    dropped = [r for r in correct if not r["kept"]]
    groups: dict[Any, set[float]] = {}
    for r in records:
        groups.setdefault(r.get("group"), set()).add(r["reward"])
    m = {
        "accuracy": d["accuracy"],
        "reward/mean": stats.mean([r["reward"] for r in records]),
        "reward/kept_mean": stats.mean([r["reward"] for r in records if r["kept"]]),
        "rollouts_kept": float(sum(r["kept"] for r in records)),
        "response/length_mean": d["length_mean"],
        "response/length_max": d["length_max"],
        "response/truncated_share": finishes["max_length"] / n,
        "tools/calls_per_traj": d["calls_per_traj"],
        "tools/error_ratio_all": d["error_ratio"],
        "tools/error_ratio_correct_all": d["error_ratio_correct"],
        "tools/error_ratio_correct_kept": stats.tool_error_ratio(kept),
        "tools/correct_with_error_share": d["correct_with_error_share"],
        # RoC's format fault: no answer, or more than one (p_format > 0), in all and in correct rollouts
        "format/fault_share": stats.mean([float(r["p_format"] > 0) for r in records]),
        "format/fault_share_correct": stats.mean([float(r["p_format"] > 0) for r in correct]),
        "time/tool_s_per_traj": stats.mean([r["tool_s"] for r in records]),
        "time/reward_s_per_traj": stats.mean([r["reward_s"] for r in records]),
        # what RL does to the programs and what RoC prefers: multi-line tool calls, the lengths of
        # correct rollouts kept and dropped, the share of groups whose rewards are all equal (no signal)
        "tools/multiline_share": d["multiline_share"],
        "tools/multiline_share_correct_kept": stats.multiline_share(kept),
        "groups/zero_spread_share": stats.mean([float(len(v) == 1) for v in groups.values()]),
    }
    if kept:
        m["roc/correct_kept_length"] = stats.mean([r["tokens"] for r in kept])
    if dropped:
        m["roc/correct_dropped_length"] = stats.mean([r["tokens"] for r in dropped])
    finish = {f"finish/{reason}": finishes[reason] / n for reason in FINISH_REASONS}
    signs = {f"health/{sign}": share for sign, share in d["health"].items()}
    return {**m, **pass_rates(records), **finish, **signs, **faulted, "rollouts": float(len(all_records))}


def pass_rates(records: list[dict[str, Any]]) -> dict[str, float]:
    """Accuracy by task family (``pass/FAMILY``) and, where it has levels, level (``pass/FAMILY/LEVEL``)."""
    cells: dict[str, list[float]] = {}
    for r in records:
        family = r.get("family")
        if family is None:
            continue
        cells.setdefault(f"pass/{family}", []).append(float(r["correct"]))
        if r.get("level") is not None:
            cells.setdefault(f"pass/{family}/{r['level']}", []).append(float(r["correct"]))
    return {k: stats.mean(v) for k, v in sorted(cells.items())}


def engine_metrics(
    before: list[dict[str, Any] | None], after: list[dict[str, Any] | None], wall_s: float
) -> dict[str, float]:
    """The engines' work over a step from their counters at its start and end (engines without: out)."""
    pairs = [(b, a) for b, a in zip(before, after, strict=True) if b and a]
    if not pairs:
        return {}

    def d(key: str) -> float:
        return float(sum(a.get(key, 0) - b.get(key, 0) for b, a in pairs))

    row_capacity = sum(a["rows"] * (a["steps"] - b["steps"]) for b, a in pairs)
    busy = d("busy_s")
    return {
        "engine/occupancy": d("row_steps") / row_capacity if row_capacity else 0.0,
        "engine/join_share": d("prefill_s") / busy if busy > 0 else 0.0,
        "engine/busy_share": busy / (wall_s * len(pairs)) if wall_s > 0 else 0.0,
        "engine/evictions": d("evictions"),
        "engine/reprefills": d("reprefills"),
        "engine/queue_wait_s": d("queue_wait_s") / max(1.0, d("requests")),
    }
