"""The Python tools the policy may call, and its Hermes-style calls parsed out of generated text.
Parsing never raises: a call that cannot run becomes a ``ToolCallError`` the model reads back (a
tool error for Resample-on-Correct)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..config import DEFAULT_CHAT
from .tags import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

PYTHON_TOOL = "execute_python_code_with_standard_io"
SESSION_TOOL = "python_session"

_CALL_RE = re.compile(
    re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|\Z)", re.DOTALL
)


def _function(name: str, description: str, **arguments: str) -> dict[str, Any]:
    """An OpenAI-style function schema; its arguments are strings, all required."""
    properties = {k: {"type": "string", "description": v} for k, v in arguments.items()}
    parameters = {"type": "object", "properties": properties, "required": list(arguments)}
    function = {"name": name, "description": description, "parameters": parameters}
    return {"type": "function", "function": function}


def tool_schemas(stateful: bool = DEFAULT_CHAT.stateful) -> list[dict[str, Any]]:
    """OpenAI-style function schemas, as chat templates take them through ``tools=``."""
    python = _function(
        PYTHON_TOOL,
        "Run a Python 3 program in a fresh, isolated interpreter and return what it printed "
        "(or the error). Nothing persists between calls. Use print() to see results.",
        code="The Python source to run.",
        input="Text given to the program on stdin.",
    )
    session = _function(
        SESSION_TOOL,
        "Run Python code in this conversation's own interpreter, like a notebook cell: variables, "
        "functions and imports of earlier calls are kept. Returns the output, or the value of the "
        "last expression.",
        code="The cell to run.",
    )
    return [python, session] if stateful else [python]


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
    if "code" not in args:
        return ToolCallError(f"missing argument(s) code for {name}", raw, name)
    defaults = {"input": ""} if name == PYTHON_TOOL else {}  # models often omit the schema's input
    unknown = sorted(set(args) - {"code", *defaults})
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
    calls = [parse_call(body, tools) for body in bodies[:max_calls]]
    return ParsedTurn(calls, skipped=max(0, len(bodies) - max_calls))
