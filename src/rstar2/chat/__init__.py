"""The paper's chat format: prompt, tools, tool-call parsing, tool responses, and token-in/token-out
rendering through the tokenizer's own chat template."""

from .format import ChatFormat, TemplateError, end_of_turn_ids, ensure_chat_template
from .prompt import CHATML_TEMPLATE, SYSTEM_PROMPT, USER_PREFIX, problem_messages
from .tool_response import DEFAULT_LIMIT_CHARS, render_result
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
    "CHATML_TEMPLATE",
    "SYSTEM_PROMPT",
    "USER_PREFIX",
    "ChatFormat",
    "TemplateError",
    "end_of_turn_ids",
    "ensure_chat_template",
    "problem_messages",
    "DEFAULT_LIMIT_CHARS",
    "PYTHON_TOOL",
    "SESSION_TOOL",
    "ParsedTurn",
    "ToolCall",
    "ToolCallError",
    "parse_call",
    "parse_tool_calls",
    "render_result",
    "tool_schemas",
]
