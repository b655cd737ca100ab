"""How a call ended, as an ``ExecResult``: the one place where exits, signals, kills and OOM become
statuses. Shared by one-off calls and session cells."""

from __future__ import annotations

import os
import signal

from .capture import CallOutput, cut_middle
from .request import Limits
from .result import ExecResult, Status

INTERNAL_EXIT = 125  # a child that failed before the code ran (its set-up), not the code's own exit


def to_result(
    limits: Limits,
    duration: float,
    output: CallOutput,
    wstatus: int | None,
    killed: str | None,
    oom: bool,
    cpu_s: float | None,
) -> ExecResult:
    """``wstatus``: the child's wait status (None: unknown); ``killed``: ``timeout`` or
    ``output_limit`` when the watcher stopped it; ``oom``: the cgroup counted an OOM kill."""
    out, err = output.out, output.err
    report = output.report()
    result = ExecResult(
        status="ok",
        stdout=out.text(),
        stderr=err.text(),
        duration_s=round(duration, 6),
        truncated=out.truncated or err.truncated,
        cpu_s=round(cpu_s, 6) if cpu_s is not None else None,
        error_type=report.get("error_type"),
    )
    if "value" in report and not out.total:
        result.value, cut = cut_middle(report["value"], limits.output_bytes)
        result.truncated = result.truncated or cut
    if wstatus is not None and os.WIFSIGNALED(wstatus):
        sig = os.WTERMSIG(wstatus)
        result.signal = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
    elif wstatus is not None:
        result.exit_code = os.WEXITSTATUS(wstatus)
    if killed is not None:
        result.signal = None  # our own kill, not the code's signal
    result.status, result.reason = _status(limits, result, report, killed, oom)
    return result


def _status(
    limits: Limits, result: ExecResult, report: dict, killed: str | None, oom: bool
) -> tuple[Status, str | None]:
    """The first cause that applies, most telling first: our own kill, a failed set-up, memory, the
    CPU limit, another signal, a non-zero exit."""
    if killed == "timeout":
        return "timeout", f"wall-clock limit of {limits.timeout_s:g} s exceeded"
    if killed == "output_limit":
        return "output_limit", f"printed more than {limits.max_output_mb:g} MB; stopped"
    if "internal" in report or result.exit_code == INTERNAL_EXIT:
        return "internal", report.get("internal", "the worker child failed")
    if oom or result.error_type == "MemoryError":
        return "memory", f"memory limit of {limits.memory_mb} MB exceeded"
    if result.signal == "SIGXCPU":
        return "timeout", f"CPU limit of {limits.effective_cpu_s()} s exceeded"
    if result.signal is not None:
        return "error", f"killed by {result.signal}"
    if result.exit_code:
        return "error", result.error_type or f"exit code {result.exit_code}"
    return "ok", None
