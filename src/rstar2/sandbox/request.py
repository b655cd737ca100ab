"""What is asked of the sandbox: the code, its stdin, and the limits it runs under."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# what one call may ask for (the service refuses more; the CLI's defaults stay within)
MAX_TIMEOUT_S = 120.0
MIN_MEMORY_MB, MAX_MEMORY_MB = 32, 16 * 1024


@dataclass(frozen=True)
class Limits:
    """Per-call resource limits. Every field has a default that suits model-written math code."""

    timeout_s: float = 10.0  # wall clock, enforced from outside the child
    memory_mb: int = 1024  # address space per process, and memory of all the call's processes together
    cpu_s: int = 0  # CPU seconds per process; 0 = derived from the timeout (timeout + 1)
    max_processes: int = 64  # processes + threads of the call
    file_size_mb: int = 64  # largest file the code may write
    open_files: int = 256
    tmp_mb: int = 64  # size of the call's private /tmp
    output_bytes: int = 64 * 1024  # stdout and stderr are each cut (in the middle) to this
    max_output_mb: float = 8.0  # printing more than this in total stops the call: status output_limit

    def merged(self, timeout_s: float | None = None, memory_mb: int | None = None) -> Limits:
        return dataclasses.replace(
            self,
            timeout_s=self.timeout_s if timeout_s is None else float(timeout_s),
            memory_mb=self.memory_mb if memory_mb is None else int(memory_mb),
        )

    def effective_cpu_s(self) -> int:
        return self.cpu_s if self.cpu_s > 0 else int(self.timeout_s) + 1

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _LIMIT_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Limits:
        return cls(**{k: v for k, v in data.items() if k in _LIMIT_FIELDS})


@dataclass
class ExecRequest:
    """One call: the code, its stdin, optional per-call overrides and an optional session."""

    code: str
    input: str = ""
    timeout_s: float | None = None
    memory_mb: int | None = None
    session_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecRequest:
        overrides = {k: data.get(k) for k in ("timeout_s", "memory_mb", "session_id")}
        return cls(code=data["code"], input=data.get("input") or "", **overrides)


_LIMIT_FIELDS = tuple(f.name for f in dataclasses.fields(Limits))
# the limits a call gets unless told, for code that takes one of them as an argument (the commands'
# options): each is written once, in ``Limits``
DEFAULT_LIMITS = Limits()
