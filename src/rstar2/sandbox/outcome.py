"""How a call ended, as an ``ExecResult``: the one place where exits, signals, kills and OOM become
statuses. Shared by one-off calls and session cells."""

from __future__ import annotations

import os
import signal

from .capture import CallOutput, cut_middle
from .request import Limits
from .result import ExecResult

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
    if killed == "timeout":
        result.status, result.reason = "timeout", f"wall-clock limit of {limits.timeout_s:g} s exceeded"
        result.signal = None
    elif killed == "output_limit":
        result.status = "output_limit"
        result.reason = f"printed more than {limits.max_output_mb:g} MB; stopped"
        result.signal = None
    elif "internal" in report or result.exit_code == INTERNAL_EXIT:
        result.status, result.reason = "internal", report.get("internal", "the worker child failed")
    elif oom or result.error_type == "MemoryError":
        result.status = "memory"
        result.reason = f"memory limit of {limits.memory_mb} MB exceeded"
    elif result.signal == "SIGXCPU":
        result.status, result.reason = "timeout", f"CPU limit of {limits.effective_cpu_s()} s exceeded"
    elif result.signal is not None:
        result.status, result.reason = "error", f"killed by {result.signal}"
    elif result.exit_code:
        result.status = "error"
        result.reason = result.error_type or f"exit code {result.exit_code}"
    return result
