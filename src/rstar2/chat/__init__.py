"""The paper's chat format: prompt, tools, tool-call parsing, tool responses, and token-in/token-out
rendering through the tokenizer's own chat template."""

from .tool_response import render_result
from .tools import PYTHON_TOOL, SESSION_TOOL, ToolCall, ToolCallError, parse_tool_calls, tool_schemas

__all__ = [
    "PYTHON_TOOL",
    "SESSION_TOOL",
    "ToolCall",
    "ToolCallError",
    "parse_tool_calls",
    "render_result",
    "tool_schemas",
]
