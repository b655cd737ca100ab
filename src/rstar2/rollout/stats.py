"""What a set of rollouts did, for training and evaluation alike: accuracy, lengths, finish reasons
and tool use, computed from small ``record``s (plain values, so training processes can exchange them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from . import health
from .trajectory import ToolCallRecord, Trajectory


def code_lines(call: ToolCallRecord) -> int:
    """Lines of a call's program that do something: blank lines and comments left out."""
    code = str((call.arguments or {}).get("code", ""))
    return sum(1 for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def record(t: Trajectory) -> dict[str, Any]:
    return {
        "correct": t.correct,
        "reward": t.reward,
        "tokens": t.response_tokens,
        "model_tokens": sum(t.loss_mask),
        "turns": len(t.turns),
        "finish": t.finish_reason,
        "calls": t.num_calls,
        "failed": t.num_failed_calls,
        # programs of several steps (SFT teaches them; RL paid by one-line arithmetic can unlearn them)
        "multiline": sum(code_lines(c) >= 2 for c in t.calls),
        **health.signs(t),  # no_call, unparseable, repeated, output_cut
    }


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def tool_error_ratio(records: Sequence[dict[str, Any]]) -> float:
    """Failed tool calls over all tool calls of ``records`` (0 when they made none)."""
    calls = sum(r["calls"] for r in records)
    return sum(r["failed"] for r in records) / calls if calls else 0.0


def multiline_share(records: Sequence[dict[str, Any]]) -> float:
    """Tool calls of two or more lines over all tool calls of ``records`` (0 when they made none)."""
    calls = sum(r["calls"] for r in records)
    return sum(r.get("multiline", 0) for r in records) / calls if calls else 0.0


def describe(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The statistics both reports share (``finishes``: a ``Counter`` of finish reasons)."""
    n = max(1, len(records))
    correct = [r for r in records if r["correct"]]
    return {
        "accuracy": len(correct) / n,
        "length_mean": mean([r["tokens"] for r in records]),
        "length_max": float(max((r["tokens"] for r in records), default=0)),
        "turns_mean": mean([r["turns"] for r in records]),
        "calls_per_traj": mean([r["calls"] for r in records]),
        "error_ratio": tool_error_ratio(records),
        "error_ratio_correct": tool_error_ratio(correct),
        "multiline_share": multiline_share(records),
        "correct_with_error_share": mean([float(r["failed"] > 0) for r in correct]),
        "finishes": Counter(r["finish"] for r in records),
        "health": health.shares(records),
    }
