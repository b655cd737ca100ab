"""What the model reads back after a tool call: the output, or a header naming the failure and the
traceback's end; long text is cut in the middle, so the beginning and the end (where the answer and
the error usually are) survive."""

from __future__ import annotations

from ..config import DEFAULT_LIMIT_CHARS, TRACEBACK_LINES
from ..sandbox.capture import cut_middle
from ..sandbox.result import ExecResult
from .tools import ToolCallError

_HEADERS = {
    "error": "Tool call failed: the code raised an error.",
    "timeout": "Tool call failed: time limit exceeded.",
    "memory": "Tool call failed: memory limit exceeded.",
    "output_limit": "Tool call failed: the code printed too much output.",
    "rejected": "Tool call failed: the request was rejected.",
    "internal": "Tool call failed: the code environment had an internal error.",
}


def render_result(
    result: ExecResult | ToolCallError,
    limit_chars: int = DEFAULT_LIMIT_CHARS,
    traceback_lines: int = TRACEBACK_LINES,
) -> str:
    return cut_middle(result_text(result, traceback_lines), limit_chars)[0]


def output_cut(result: ExecResult | ToolCallError) -> bool:
    """The code printed more than the code environment kept (its capture bound or output limit)."""
    return isinstance(result, ExecResult) and (result.truncated or result.status == "output_limit")


def result_text(result: ExecResult | ToolCallError, traceback_lines: int = TRACEBACK_LINES) -> str:
    """The whole text of a response, before any cut to the model's limit."""
    if isinstance(result, ToolCallError):
        return f"Tool call failed: {result.message}."
    if result.ok:
        return result.output.rstrip("\n") or "(the code ran and printed nothing)"
    details = result.reason or ""
    tail = "\n".join(result.stderr.rstrip("\n").splitlines()[-traceback_lines:])
    printed = result.stdout.rstrip("\n")
    parts = [_HEADERS.get(result.status, f"Tool call failed: {result.status}.")]
    if details and details not in tail:
        parts.append(details)
    if printed:
        parts.append(f"Output before the failure:\n{printed}")
    if tail:
        parts.append(tail)
    return "\n".join(parts)
