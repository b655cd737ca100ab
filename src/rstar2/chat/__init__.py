"""The paper's chat format: tools, tool-call parsing and tool responses (rendering through the
tokenizer's chat template follows with the engines)."""

from .tool_response import DEFAULT_LIMIT_CHARS, is_tool_error, render_result, wrap
from .tools import (
    PYTHON_TOOL,
    SESSION_TOOL,
    ParsedTurn,
    ToolCall,
    ToolCallError,
    parse_call,
    parse_tool_calls,
    tool_schemas,
)

__all__ = [
    "DEFAULT_LIMIT_CHARS",
    "PYTHON_TOOL",
    "SESSION_TOOL",
    "ParsedTurn",
    "ToolCall",
    "ToolCallError",
    "is_tool_error",
    "parse_call",
    "parse_tool_calls",
    "render_result",
    "tool_schemas",
    "wrap",
]
