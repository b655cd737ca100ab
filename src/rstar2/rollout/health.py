"""Tool-use health: the failures peer systems' users report of agentic RL (``SIGNS``). A step's share
of rollouts showing each sign is ``health/<sign>`` in the metrics; ``Watch`` warns on every step over
``run.health``'s limit, and asks to stop after ``patience`` steps in a row."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..chat.tool_response import output_cut
from ..config import DEFAULT_HEALTH
from ..jsonl import read_jsonl, write_jsonl
from .trajectory import ToolCallRecord, Trajectory

SIGNS: dict[str, str] = {
    "no_call": "no tool call",
    "unparseable": "a tool call that could not be parsed",
    "repeated": "the same tool call repeated",
    "output_cut": "tool output cut at the limit",
}


def _call_key(c: ToolCallRecord) -> tuple[str, str, str]:
    """A call as the code environment sees it: whitespace does not make a call new."""
    args = c.arguments or {}
    return (c.name or "", " ".join(str(args.get("code", "")).split()), str(args.get("input", "")).strip())


def signs(t: Trajectory) -> dict[str, bool]:
    """Which signs one rollout shows. A call beyond the per-turn maximum (not run) still counts as
    a call written; a malformed call counts as written but never as a repeat."""
    calls = t.calls
    written = len(calls) + sum(turn.skipped_calls for turn in t.turns)
    parsed = [_call_key(c) for c in calls if c.result is not None]
    return {
        "no_call": written == 0,
        "unparseable": any(c.result is None for c in calls),
        "repeated": len(set(parsed)) < len(parsed),
        "output_cut": any(c.cut or (c.result is not None and output_cut(c.result)) for c in calls),
    }


def shares(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The share of ``records`` (``rollout.stats.record``s) showing each sign."""
    n = len(records)
    return {s: (sum(bool(r.get(s)) for r in records) / n if n else 0.0) for s in SIGNS}


@dataclass
class HealthWarning:
    step: int
    sign: str
    share: float
    limit: float
    steps_over: int  # consecutive steps over the limit, this one included

    @property
    def message(self) -> str:
        return (
            f"tool-use health, step {self.step}: {self.share:.0%} of rollouts show {SIGNS[self.sign]} "
            f"(run.health.{self.sign} = {self.limit:g}; {self.steps_over} step(s) in a row)"
        )


@dataclass
class Watch:
    """``limits``: a sign's largest healthy share (None: not watched); ``patience``: steps in a row
    over a limit before ``stop_reason`` asks to stop (only when ``stop``)."""

    limits: Mapping[str, float | None]
    patience: int = DEFAULT_HEALTH.patience
    stop: bool = DEFAULT_HEALTH.stop
    over: dict[str, int] = field(default_factory=dict)

    def observe(self, step: int, metrics: Mapping[str, Any]) -> list[HealthWarning]:
        """The warnings of one step, from its ``health/<sign>`` metrics."""
        out = []
        for sign in SIGNS:
            limit, share = self.limits.get(sign), metrics.get(f"health/{sign}")
            if limit is None or share is None or share <= limit:
                self.over[sign] = 0
                continue
            self.over[sign] = self.over.get(sign, 0) + 1
            out.append(HealthWarning(step, sign, float(share), float(limit), self.over[sign]))
        return out

    def resume(self, warnings: Sequence[Mapping[str, Any]], step: int) -> None:
        """Continue the counts of a run resumed after ``step`` from its ``health.jsonl``."""
        warned = {(w.get("step"), w.get("sign")) for w in warnings}
        for sign in SIGNS:
            self.over[sign] = next(n for n in itertools.count() if (step - n, sign) not in warned)

    def stop_reason(self, warnings: Sequence[HealthWarning]) -> str | None:
        """Why the run should stop now, or None."""
        lasting = [w for w in warnings if w.steps_over >= self.patience]
        if not self.stop or not lasting:
            return None
        w = lasting[0]
        return (
            f"stopped by run.health: {SIGNS[w.sign]} in {w.share:.0%} of rollouts, over "
            f"run.health.{w.sign} = {w.limit:g} for {w.steps_over} steps in a row (run.health.patience "
            f"= {self.patience}); look at the step's samples with `rstar2 view`, or set "
            "run.health.stop: false to only warn"
        )


HEALTH_FILE = "health.jsonl"  # a run's warnings, one a line, beside metrics.jsonl


def read_warnings(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / HEALTH_FILE
    return read_jsonl(path, strict=False) if path.exists() else []


def keep_warnings_until(run_dir: str | Path, step: int, rewrite: bool = True) -> list[dict[str, Any]]:
    """On resume, the warnings up to ``step`` (the steps after it are redone); ``rewrite``: in the file."""
    path = Path(run_dir) / HEALTH_FILE
    kept = [w for w in read_warnings(run_dir) if w.get("step", 0) <= step]
    if rewrite and path.exists():
        write_jsonl(kept, path)
    return kept


def append_warnings(run_dir: str | Path, warnings: Sequence[HealthWarning]) -> None:
    if warnings:
        with (Path(run_dir) / HEALTH_FILE).open("a") as f:
            f.writelines(json.dumps({**asdict(w), "message": w.message}) + "\n" for w in warnings)
