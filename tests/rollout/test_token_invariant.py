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


def closing_text(fmt: ChatFormat, model_end: str) -> str:
    """What the template writes after a final assistant turn beyond the model's own stop token."""
    end = fmt.after_assistant
    return end[len(model_end) :] if end.startswith(model_end) else ""


TEMPLATES = ["chatml", "llama3", "smollm2"]


def scripted(template: str, tokenizers: dict, char_level: bool = False) -> tuple[ChatFormat, ScriptedEngine]:
    tok = tokenizers[template]
    fmt = ChatFormat(tok)
    end, marker = (
        ("<|eot_id|>", "<|start_header_id|>assistant")
        if template == "llama3"
        else ("<|im_end|>", "<|im_start|>assistant")
    )
    end_id = tok.convert_tokens_to_ids(end)
    return fmt, ScriptedEngine(fmt, {PROBLEM: SCRIPT}, end_id, marker, char_level=char_level)


@pytest.fixture
def tokenizers(tiny, llama_tokenizer, smollm2_tokenizer):
    return {"chatml": tiny[1], "llama3": llama_tokenizer, "smollm2": smollm2_tokenizer}


@pytest.fixture(params=TEMPLATES)
def setup(request, tokenizers):
    return scripted(request.param, tokenizers)


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
    assert decoded + closing_text(fmt, end) == rendered

    # the loss mask selects exactly what the engine generated, in order; logprobs align
    model_ids = [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m]
    assert model_ids == [t for turn in engine.generated[PROBLEM] for t in turn]
    assert len(traj.logprobs) == len(traj.response_ids)
    assert all((lp == -0.5) == bool(m) for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True))
    # tool text never reaches the reward: the model's own text holds no tool output
    assert "42" not in traj.model_text and "ZeroDivisionError" in fmt.decode(traj.response_ids)


@pytest.mark.parametrize("template", TEMPLATES)
async def test_the_trajectory_keeps_the_engines_own_ids_and_logprobs(template, tokenizers, pool, verifier):
    """An engine whose tokenization is not the tokenizer's own (one character at a time, as a
    sampler may well produce) and whose logprobs differ at every token: the trajectory must hold
    exactly those ids and logprobs. A runner that re-encodes a turn's text, or re-tokenizes the
    conversation at a tool turn, gets canonical ids back and fails here."""
    fmt, engine = scripted(template, tokenizers, char_level=True)
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
    assert fmt.decode(traj.prompt_ids + traj.response_ids) + closing_text(fmt, end_text) == fmt.render(
        messages
    )


def test_a_template_without_tools_support_finds_the_tools_in_the_system_message(smollm2_tokenizer, tiny):
    fmt = ChatFormat(smollm2_tokenizer)
    assert fmt.tools_in_system and not ChatFormat(tiny[1]).tools_in_system
    prompt = fmt.decode(fmt.prompt_ids("What is 17 * 23?"))
    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n" + fmt.system_prompt)  # rstar2's prompt, then the tools
    assert "# Tools" in system and PYTHON_TOOL in system and "<tool_call>" in system
    assert "SmolLM" not in prompt  # the template's default system message only stands in for none
    plain = ChatFormat(smollm2_tokenizer, tools_in_prompt=False, system_prompt="")
    assert "# Tools" not in plain.decode(plain.prompt_ids("x")) and not plain.tools_in_system
    # SFT data tokenized turn by turn on this template: the mask is exactly the assistant turns
    msgs = [
        *fmt.problem_messages("What is 2 + 3?"),
        {"role": "assistant", "content": "<reason> add </reason>" + call("print(2 + 3)")},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "<answer> \\boxed{5} </answer>"},
    ]
    ids, mask = fmt.conversation_ids(msgs)
    assert fmt.decode(ids) + closing_text(fmt, "<|im_end|>") == fmt.render(msgs)
    learned = fmt.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert (
        learned
        == "<reason> add </reason>"
        + call("print(2 + 3)")
        + "<|im_end|><answer> \\boxed{5} </answer><|im_end|>"
    )
    # the SFT data's structured tool calls, which this template would drop, become the text a rollout parses
    from rstar2.chat.tools import parse_tool_calls
    from rstar2.recipe.sft_data import call_message

    assert fmt.calls_in_text and not ChatFormat(tiny[1]).calls_in_text
    msgs[2] = call_message("print(2 + 3)")
    ids, mask = fmt.conversation_ids(msgs)
    first = fmt.decode([i for i, m in zip(ids, mask, strict=True) if m]).split("<|im_end|>")[0]
    parsed = parse_tool_calls(first, tools=fmt.tool_names)
    assert [c.arguments["code"] for c in parsed.calls] == ["print(2 + 3)"]


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
    out = fmt.tool_response(ExecResult(status="ok", stdout="START " + "x1 " * 500 + " END\n"))[0]
    assert out.startswith("START") and out.endswith("END") and "tokens cut" in out
    assert len(fmt.encode(out)) < 80
