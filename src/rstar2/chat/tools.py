"""The Python tools the policy may call, and parsing its calls out of generated text.

A call is JSON ``{"name": …, "arguments": {…}}`` inside ``<tool_call>…</tool_call>`` (Hermes /
Qwen style). Whatever the model writes, parsing never raises: a call that cannot be executed
becomes a ``ToolCallError`` whose message goes back to the model as a tool response and counts
as a tool error in Resample-on-Correct.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .tags import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

PYTHON_TOOL = "execute_python_code_with_standard_io"
SESSION_TOOL = "python_session"

_CALL_RE = re.compile(
    re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|\Z)", re.DOTALL
)


def tool_schemas(stateful: bool = False) -> list[dict[str, Any]]:
    """OpenAI-style function schemas, as chat templates take them through ``tools=``."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": PYTHON_TOOL,
                "description": (
                    "Run a Python 3 program in a fresh, isolated interpreter and return what it printed "
                    "(or the error). Nothing persists between calls. Use print() to see results."
                ),
                "parameters": {
                    "type": "object",
                    "properties": {
                        "code": {"type": "string", "description": "The Python source to run."},
                        "input": {"type": "string", "description": "Text given to the program on stdin."},
                    },
                    "required": ["code", "input"],
                },
            },
        }
    ]
    if stateful:
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": SESSION_TOOL,
                    "description": (
                        "Run Python code in this conversation's own interpreter, like a notebook cell: "
                        "variables, functions and imports of earlier calls are kept. Returns the output, "
                        "or the value of the last expression."
                    ),
                    "parameters": {
                        "type": "object",
                        "properties": {"code": {"type": "string", "description": "The cell to run."}},
                        "required": ["code"],
                    },
                },
            }
        )
    return tools


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, str]
    raw: str = ""


@dataclass
class ToolCallError:
    """A call that cannot run; ``message`` is what the model is told."""

    message: str
    raw: str = ""
    name: str | None = None


@dataclass
class ParsedTurn:
    calls: list[ToolCall | ToolCallError] = field(default_factory=list)
    skipped: int = 0  # well-formed or not, calls beyond the per-turn maximum

    @property
    def has_calls(self) -> bool:
        return bool(self.calls)


def _argument_spec(name: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """(required arguments, defaults) of a known tool."""
    if name == PYTHON_TOOL:
        return ("code",), {"input": ""}  # the schema lists input as required; models often omit it
    return ("code",), {}


def parse_call(raw: str, tools: tuple[str, ...] = (PYTHON_TOOL,)) -> ToolCall | ToolCallError:
    """One ``<tool_call>`` body to a call, or to the error the model should read."""
    body = raw.strip()
    try:
        data = json.loads(body)
    except ValueError as exc:
        return ToolCallError(f"the tool call is not valid JSON ({exc.msg} at position {exc.pos})", raw)
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCallError('a tool call must be a JSON object {"name": ..., "arguments": {...}}', raw)
    name = data["name"]
    if name not in tools:
        return ToolCallError(f"unknown tool {name!r}; available: {', '.join(tools)}", raw, name)
    args = data.get("arguments", {})
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args)
        except ValueError:
            return ToolCallError("the arguments are a string that is not a JSON object", raw, name)
    if not isinstance(args, dict):
        return ToolCallError("the arguments must be a JSON object", raw, name)
    required, defaults = _argument_spec(name)
    missing = [a for a in required if a not in args]
    if missing:
        return ToolCallError(f"missing argument(s) {', '.join(missing)} for {name}", raw, name)
    allowed = set(required) | set(defaults)
    unknown = sorted(set(args) - allowed)
    if unknown:
        return ToolCallError(f"unexpected argument(s) {', '.join(unknown)} for {name}", raw, name)
    values = {**defaults, **args}
    if not all(isinstance(v, str) for v in values.values()):
        return ToolCallError(f"every argument of {name} must be a string", raw, name)
    return ToolCall(name, values, raw)


def parse_tool_calls(text: str, *, tools: tuple[str, ...] = (PYTHON_TOOL,), max_calls: int = 1) -> ParsedTurn:
    """Every ``<tool_call>`` of one generated turn (a last unclosed one included, since engines
    often stop on ``</tool_call>`` and drop it); at most ``max_calls`` are kept."""
    if max_calls < 1:
        raise ValueError("max_calls must be at least 1")
    bodies = [m.group(1) for m in _CALL_RE.finditer(text)]
    turn = ParsedTurn()
    for body in bodies[:max_calls]:
        turn.calls.append(parse_call(body, tools))
    turn.skipped = max(0, len(bodies) - max_calls)
    return turn
