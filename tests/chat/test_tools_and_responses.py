"""Tool-call parsing never raises, and tool responses read well."""

import json

import pytest

from rstar2.chat.tool_response import render_result
from rstar2.chat.tools import (
    PYTHON_TOOL,
    SESSION_TOOL,
    ToolCall,
    ToolCallError,
    parse_tool_calls,
    tool_schemas,
)
from rstar2.sandbox.result import ExecResult


def call(name=PYTHON_TOOL, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_a_well_formed_call():
    turn = parse_tool_calls("<reason>let me compute</reason>\n" + call(code="print(6*7)", input="3"))
    assert turn.calls == [ToolCall(PYTHON_TOOL, {"code": "print(6*7)", "input": "3"}, turn.calls[0].raw)]
    assert turn.skipped == 0


def test_missing_input_defaults_to_empty_and_arguments_may_be_double_encoded():
    body = json.dumps({"name": PYTHON_TOOL, "arguments": json.dumps({"code": "print(1)"})})
    (parsed,) = parse_tool_calls(f"<tool_call>{body}</tool_call>").calls
    assert isinstance(parsed, ToolCall) and parsed.arguments == {"code": "print(1)", "input": ""}


def test_a_last_unclosed_call_is_parsed():
    (parsed,) = parse_tool_calls(
        "thinking <tool_call>" + json.dumps({"name": PYTHON_TOOL, "arguments": {"code": "1"}})
    ).calls
    assert isinstance(parsed, ToolCall)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            '{"name": "execute_python_code_with_standard_io", "arguments": {"code": "print(1)"',
            "not valid JSON",
        ),
        ("[1, 2]", "must be a JSON object"),
        ('{"name": "shell", "arguments": {"code": "ls"}}', "unknown tool 'shell'"),
        ('{"name": "execute_python_code_with_standard_io", "arguments": {}}', "missing argument(s) code"),
        ('{"name": "execute_python_code_with_standard_io", "arguments": {"code": 5}}', "must be a string"),
        (
            '{"name": "execute_python_code_with_standard_io", "arguments": {"code": "1", "x": "2"}}',
            "unexpected argument(s) x",
        ),
        ('{"name": "execute_python_code_with_standard_io", "arguments": "nope"}', "not a JSON object"),
    ],
)
def test_malformed_calls_become_errors_never_exceptions(body, message):
    (parsed,) = parse_tool_calls(f"<tool_call>{body}</tool_call>").calls
    assert isinstance(parsed, ToolCallError) and message in parsed.message
    assert parsed.message in render_result(parsed)


def test_calls_beyond_the_maximum_are_counted_not_run():
    text = call(code="print(1)") + call(code="print(2)") + call(code="print(3)")
    turn = parse_tool_calls(text, max_calls=2)
    assert [c.arguments["code"] for c in turn.calls] == ["print(1)", "print(2)"] and turn.skipped == 1
    with pytest.raises(ValueError):
        parse_tool_calls(text, max_calls=0)


def test_no_call_and_the_session_tool():
    assert not parse_tool_calls("<answer>\\boxed{3}</answer>").calls
    (parsed,) = parse_tool_calls(call(SESSION_TOOL, code="x = 1")).calls
    assert isinstance(parsed, ToolCallError)  # not offered unless asked for
    (parsed,) = parse_tool_calls(call(SESSION_TOOL, code="x = 1"), tools=(PYTHON_TOOL, SESSION_TOOL)).calls
    assert parsed == ToolCall(SESSION_TOOL, {"code": "x = 1"}, parsed.raw)
    names = [t["function"]["name"] for t in tool_schemas(stateful=True)]
    assert names == [PYTHON_TOOL, SESSION_TOOL]


def test_rendering_results():
    assert render_result(ExecResult("ok", stdout="42\n")) == "42"
    assert render_result(ExecResult("ok", value="7")) == "7"
    assert "printed nothing" in render_result(ExecResult("ok"))
    tb = (
        "Traceback (most recent call last):\n"
        + "".join(f'  File "<code>", line {i}\n' for i in range(40))
        + "ZeroDivisionError: division by zero\n"
    )
    failed = render_result(ExecResult("error", stdout="partial\n", stderr=tb, error_type="ZeroDivisionError"))
    assert failed.startswith("Tool call failed: the code raised an error.")
    assert "partial" in failed and failed.endswith("ZeroDivisionError: division by zero")
    assert len(failed.splitlines()) < 20  # only the end of the traceback
    timeout = render_result(ExecResult("timeout", reason="wall-clock limit of 10 s"))
    assert "time limit" in timeout and "10 s" in timeout


def test_long_output_is_cut_in_the_middle():
    text = render_result(ExecResult("ok", stdout="BEGIN" + "x" * 10_000 + "END"), limit_chars=200)
    assert text.startswith("BEGIN") and text.endswith("END") and "characters cut" in text and len(text) < 300


async def test_a_real_sandbox_result_renders(pool):
    result = await pool.run("import math\nprint(math.factorial(5))\n1/0")
    text = render_result(result)
    assert "120" in text and "ZeroDivisionError" in text and not result.ok
