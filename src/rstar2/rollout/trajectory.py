"""``Trajectory``: the one object that flows from rollout to verifier to RoC to the loss."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..jsonl import iter_jsonl
from ..sandbox.result import FAULT_STATUSES, ExecResult

FinishReason = Literal["answer", "no_tool_call", "max_turns", "max_length", "error"]


@dataclass
class ToolCallRecord:
    """One tool call as the model wrote it, and what came back."""

    name: str | None
    arguments: dict[str, Any]
    response: str  # the text the model read
    result: ExecResult | None = None  # None when the call itself was malformed
    error: str | None = None  # why a malformed call could not run
    cut: bool = False  # the model read less than the code printed (``ChatFormat.tool_response``)

    @property
    def failed(self) -> bool:
        return self.result is None or not self.result.ok

    @property
    def fault(self) -> bool:
        """The code environment failed (``FAULT_STATUSES``), not the model's code."""
        return self.result is not None and self.result.status in FAULT_STATUSES

    @property
    def status(self) -> str:
        return "malformed" if self.result is None else self.result.status

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "result": self.result.to_dict() if self.result is not None else None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCallRecord:
        res = d.get("result")
        return cls(
            name=d.get("name"),
            arguments=d.get("arguments") or {},
            response=d.get("response", ""),
            result=ExecResult.from_dict(res) if res else None,
            error=d.get("error"),
            cut=bool(d.get("cut", False)),
        )


@dataclass
class Turn:
    """One assistant turn: what it generated, the calls it made, the tool tokens appended after it."""

    text: str
    model_tokens: int
    calls: list[ToolCallRecord] = field(default_factory=list)
    skipped_calls: int = 0  # calls beyond the per-turn maximum (not run)
    tool_tokens: int = 0
    gen_s: float = 0.0
    tool_s: float = 0.0
    engine: str = ""


@dataclass
class Trajectory:
    """Prompt and response ids; per response token: ``loss_mask`` (1: the model's, 0: a tool turn's),
    ``logprobs`` (the engine's, the behaviour policy's; 0.0 on tool tokens) and ``versions`` (the
    policy version that sampled it; -1 on tool tokens, or where the engine does not say)."""

    problem: str
    reference: str | None
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    finish_reason: FinishReason = "max_turns"
    reward: float = 0.0
    answer: str | None = None  # what the verifier extracted
    verdict: str = ""  # the verifier's reason
    meta: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    # The system, not the model, spoiled this rollout: "engine" (its engine failed and retries ran
    # out), "sandbox" (a tool call hit a FAULT_STATUSES result), "verifier" (the checker failed or was
    # starved). Such rollouts are left out of the update and counted under faults/* (rl/trainer.py).
    fault: str | None = None

    @property
    def calls(self) -> list[ToolCallRecord]:
        return [c for t in self.turns for c in t.calls]

    @property
    def num_calls(self) -> int:
        return len(self.calls)

    @property
    def num_failed_calls(self) -> int:
        """Calls that failed because of the model: malformed, or the code failed (not a fault)."""
        return sum(c.failed and not c.fault for c in self.calls)

    @property
    def num_faulted_calls(self) -> int:
        return sum(c.fault for c in self.calls)

    @property
    def model_versions(self) -> list[int]:
        """The policy versions that sampled the model's tokens (empty where none were recorded)."""
        return [v for v, m in zip(self.versions, self.loss_mask, strict=False) if m]

    @property
    def model_text(self) -> str:
        """Only what the model wrote: the reward never reads tool output."""
        return "".join(t.text for t in self.turns)

    @property
    def correct(self) -> bool:
        return self.reward > 0

    @property
    def response_tokens(self) -> int:
        return len(self.response_ids)

    def to_dict(self) -> dict[str, Any]:
        turns = [
            {**{k: v for k, v in asdict(t).items() if k != "calls"}, "calls": [c.to_dict() for c in t.calls]}
            for t in self.turns
        ]
        return {**asdict(self), "turns": turns}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        turns = [
            Turn(**{**t, "calls": [ToolCallRecord.from_dict(c) for c in t["calls"]]})
            for t in d.get("turns", [])
        ]
        return cls(**{**d, "turns": turns})


def read_trajectories(path: str | Path) -> tuple[list[Trajectory], int]:
    """Every complete trajectory of a file (``rstar2 eval`` output, RL samples), and how many lines
    were not one (a line cut by a crash is dropped, and a resumed evaluation reruns it)."""
    out: list[Trajectory] = []
    skipped: list[int] = []  # lines that are not JSON, or not a trajectory
    if Path(path).exists():
        for n, row in iter_jsonl(path, strict=False, skipped=skipped):
            try:
                out.append(Trajectory.from_dict(row))
            except (ValueError, TypeError, KeyError, AttributeError):
                skipped.append(n)
    return out, len(skipped)
