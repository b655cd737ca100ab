"""What came back from the sandbox: the structured outcome of one call, and its statuses."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "rejected", "internal"]
STATUSES: tuple[str, ...] = get_args(Status)
# The code environment failed, not the code: unreachable or crashed (internal), a request it could not
# take (rejected: an expired session, sessions in Redis mode). Never counted as the model's error.
FAULT_STATUSES = frozenset({"internal", "rejected"})


@dataclass
class ExecResult:
    """The structured outcome of one call. Nobody greps output text for the word "error"."""

    status: Status
    stdout: str = ""
    stderr: str = ""
    value: str | None = None  # repr of a trailing expression when nothing was printed
    exit_code: int | None = None
    signal: str | None = None  # e.g. "SIGSEGV" when a signal ended the code
    duration_s: float = 0.0
    truncated: bool = False
    error_type: str | None = None  # exception class name for status "error"/"memory"
    reason: str | None = None  # a short human-readable explanation for non-ok statuses
    cpu_s: float | None = None  # CPU time of the call's process
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def output(self) -> str:
        """What a notebook would show: stdout, or the trailing expression's value."""
        return self.stdout or self.value or ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (shallow: one result per call, so this is on the hot path)."""
        data = {name: getattr(self, name) for name in _RESULT_FIELDS if name != "extra"}
        if self.extra:
            data["extra"] = dict(self.extra)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecResult:
        return cls(**{k: v for k, v in data.items() if k in _RESULT_FIELDS})

    @classmethod
    def failure(cls, status: Status, reason: str) -> ExecResult:
        return cls(status=status, reason=reason)


_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(ExecResult))
