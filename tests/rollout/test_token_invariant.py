"""Token-in, token-out: the accumulated ids are exactly what the chat template renders for the
same messages, on two different templates, and the loss mask covers exactly the model's tokens."""

from __future__ import annotations

import json

import pytest

from rstar2.chat.format import ChatFormat
from rstar2.chat.prompt import problem_messages
from rstar2.chat.tools import PYTHON_TOOL
from rstar2.config import RolloutSection
from rstar2.rollout import Rollout

from .conftest import ScriptedEngine


def call(code: str, stdin: str = "") -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": PYTHON_TOOL, "arguments": {"code": code, "input": stdin}})
        + "\n</tool_call>"
    )


SCRIPT = [
    "<reason> Let me compute the sum first. </reason>" + call("print(sum(range(1, 11)))"),
    "<reason> Read it from stdin too. </reason>" + call("n = int(input())\nprint(n * 2)", "21"),
    '<reason> Oops. </reason><tool_call>{"name": "execute_python_code_with_standard_io", "arguments": {"code": </tool_call>',
    "<reason> A failing call. </reason>" + call("1/0"),
    "<reason> So the answer is 55. </reason> <answer> \\boxed{55} </answer>",
]
PROBLEM = "Find 1 + 2 + ... + 10."


@pytest.fixture(params=["chatml", "llama3"])
def setup(request, tiny, llama_tokenizer):
    tok = tiny[1] if request.param == "chatml" else llama_tokenizer
    fmt = ChatFormat(tok)
    end = "<|im_end|>" if request.param == "chatml" else "<|eot_id|>"
    marker = "<|im_start|>assistant" if request.param == "chatml" else "<|start_header_id|>assistant"
    engine = ScriptedEngine(fmt, {PROBLEM: SCRIPT}, tok.convert_tokens_to_ids(end), marker)
    return fmt, engine


async def test_ids_decode_to_the_template_rendering_and_mask_is_the_model(setup, pool, verifier):
    fmt, engine = setup
    rollout = Rollout(engine, fmt, pool, verifier, RolloutSection(max_turns=10))
    traj = await rollout.run(PROBLEM, "55")
    assert traj.finish_reason == "answer" and traj.reward == 1.0
    assert [c.status for c in traj.calls] == ["ok", "ok", "malformed", "error"]
    assert traj.calls[1].response == "42"

    # the same conversation as messages, rendered by the template in one go
    messages = problem_messages(PROBLEM)
    for turn in traj.turns:
        messages.append({"role": "assistant", "content": turn.text})
        messages += [{"role": "tool", "content": c.response} for c in turn.calls]
    rendered = fmt.render(messages)
    decoded = fmt.decode(traj.prompt_ids + traj.response_ids)
    end = fmt.decode(traj.response_ids[-1:])
    assert decoded + fmt.closing_text(end) == rendered

    # the loss mask selects exactly what the engine generated, in order; logprobs align
    model_ids = [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m]
    assert model_ids == [t for turn in engine.generated[PROBLEM] for t in turn]
    assert len(traj.logprobs) == len(traj.response_ids)
    assert all((lp == -0.5) == bool(m) for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True))
    # tool text never reaches the reward: the model's own text holds no tool output
    assert "42" not in traj.model_text and "ZeroDivisionError" in fmt.decode(traj.response_ids)


@pytest.mark.parametrize("template", ["chatml", "llama3"])
async def test_the_trajectory_keeps_the_engines_own_ids_and_logprobs(
    template, tiny, llama_tokenizer, pool, verifier
):
    """An engine whose tokenization is not the tokenizer's own (one character at a time, as a
    sampler may well produce) and whose logprobs differ at every token: the trajectory must hold
    exactly those ids and logprobs. A runner that re-encodes a turn's text, or re-tokenizes the
    conversation at a tool turn, gets canonical ids back and fails here."""
    tok = tiny[1] if template == "chatml" else llama_tokenizer
    fmt = ChatFormat(tok)
    end = "<|im_end|>" if template == "chatml" else "<|eot_id|>"
    marker = "<|im_start|>assistant" if template == "chatml" else "<|start_header_id|>assistant"
    engine = ScriptedEngine(fmt, {PROBLEM: SCRIPT}, tok.convert_tokens_to_ids(end), marker, char_level=True)
    canonical = [fmt.encode(s) for s in SCRIPT]
    assert all(
        len(c) < len(g)
        for c, g in zip(canonical, [[i for ch in s for i in fmt.encode(ch)] for s in SCRIPT], strict=True)
    )
    traj = await Rollout(engine, fmt, pool, verifier, RolloutSection(max_turns=10)).run(PROBLEM, "55")
    assert traj.finish_reason == "answer" and traj.reward == 1.0
    model = [i for i, m in enumerate(traj.loss_mask) if m]
    assert [traj.response_ids[i] for i in model] == [t for turn in engine.generated[PROBLEM] for t in turn]
    assert [traj.logprobs[i] for i in model] == [lp for turn in engine.logprobs[PROBLEM] for lp in turn]
    # the tool turns between are the template's, and the whole still decodes to the rendering
    messages = problem_messages(PROBLEM)
    for turn in traj.turns:
        messages.append({"role": "assistant", "content": turn.text})
        messages += [{"role": "tool", "content": c.response} for c in turn.calls]
    end_text = fmt.decode(traj.response_ids[-1:])
    assert fmt.decode(traj.prompt_ids + traj.response_ids) + fmt.closing_text(end_text) == fmt.render(
        messages
    )


def test_tool_turn_is_the_template_difference(chatml):
    text = chatml.tool_turn_text(["a", "b"], model_end="<|im_end|>")
    assert text == (
        "\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    # a model that stopped without its end token gets the template's end appended for it
    assert chatml.tool_turn_text(["a"], model_end="").startswith("<|im_end|>\n<|im_start|>user")


def test_prompt_lists_the_tools_and_the_format(chatml):
    text = chatml.decode(chatml.prompt_ids("What is 6 * 7?"))
    assert PYTHON_TOOL in text and "<tools>" in text and "<answer>" in text
    assert text.endswith("What is 6 * 7?<|im_end|>\n<|im_start|>assistant\n")


def test_long_tool_output_is_cut_in_the_middle_by_tokens(tiny):
    from rstar2.sandbox.result import ExecResult

    fmt = ChatFormat(tiny[1], tool_limit_tokens=40)
    out = fmt.tool_text(ExecResult(status="ok", stdout="START " + "x1 " * 500 + " END\n"))
    assert out.startswith("START") and out.endswith("END") and "tokens cut" in out
    assert len(fmt.encode(out)) < 80
