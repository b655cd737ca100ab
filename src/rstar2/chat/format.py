"""Token-in, token-out conversations through the tokenizer's own chat template: only a new tool
turn is tokenized, its text the difference of two renderings of a stand-in conversation (so any
template works), plus what the template writes after an assistant message that the model did not
(ChatML's newline after ``<|im_end|>``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from ..config import DEFAULT_CHAT
from ..sandbox.capture import cut_middle
from ..sandbox.result import ExecResult
from .prompt import CHATML_TEMPLATE, SYSTEM_PROMPT, USER_PREFIX, problem_messages, tools_section
from .tags import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from .tool_response import output_cut, result_text
from .tools import PYTHON_TOOL, SESSION_TOOL, ToolCallError, tool_schemas

_MARK = "RSTAR2ASSISTANTTURN"


class TemplateError(ValueError):
    """The chat template cannot be used token-in/token-out (see the message for why)."""


def ensure_chat_template(tokenizer: Any) -> None:
    """Give a tokenizer without a chat template rstar2's ChatML one (with tool support)."""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE


def end_of_turn_ids(tokenizer: Any) -> tuple[int, ...]:
    """The tokenizer's eos and the usual end-of-turn tokens of chat templates that it knows."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    vocab = tokenizer.get_vocab()
    ends = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
    return tuple(sorted(ids | {vocab[tok] for tok in ends if tok in vocab}))


def takes_tools(tokenizer: Any, tools: list[dict]) -> bool:
    """Whether the chat template renders the ``tools=`` it is given (some ignore them silently)."""
    probe = [{"role": "user", "content": "1+1"}]
    with_tools = tokenizer.apply_chat_template(probe, tools=tools, tokenize=False)
    return with_tools != tokenizer.apply_chat_template(probe, tokenize=False)


def renders_tool_calls(tokenizer: Any) -> bool:
    """Whether the chat template writes an assistant message's ``tool_calls`` (some drop them)."""
    call = {"type": "function", "function": {"name": "probe_fn", "arguments": {"x": 1}}}
    probe = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    try:
        return "probe_fn" in tokenizer.apply_chat_template(probe, tokenize=False)
    except Exception:  # a template that refuses the field cannot render it either
        return False


def calls_as_text(messages: list[dict]) -> list[dict]:
    """Assistant ``tool_calls`` written into the content as the model writes them in a rollout."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            text = [m.get("content") or ""]
            for call in m["tool_calls"]:
                f = call.get("function", call)
                args = json.loads(f["arguments"]) if isinstance(f["arguments"], str) else f["arguments"]
                body = json.dumps({"name": f["name"], "arguments": args})
                text.append(f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}")
            rest = {k: v for k, v in m.items() if k != "tool_calls"}
            m = {**rest, "content": "\n".join(t for t in text if t)}
        out.append(m)
    return out


def with_tools_in_system(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation with ``tools_section`` appended to its system message (or as one)."""
    section = tools_section(tools)
    if messages and messages[0].get("role") == "system" and messages[0].get("content"):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{section}"}, *messages[1:]]
    rest = messages[1:] if messages and messages[0].get("role") == "system" else messages
    return [{"role": "system", "content": section}, *rest]


@dataclass
class ChatFormat:
    """Renders prompts and tool turns for one tokenizer; ids are lists of ints."""

    tokenizer: Any
    # ``ChatSection``'s settings, its defaults
    stateful: bool = DEFAULT_CHAT.stateful
    system_prompt: str | None = DEFAULT_CHAT.system_prompt
    user_prefix: str | None = DEFAULT_CHAT.user_prefix
    tool_limit_chars: int = DEFAULT_CHAT.tool_limit_chars
    tool_limit_tokens: int | None = DEFAULT_CHAT.tool_limit_tokens
    tool_traceback_lines: int = DEFAULT_CHAT.tool_traceback_lines
    tools_in_prompt: bool = DEFAULT_CHAT.tools_in_prompt

    @classmethod
    def from_settings(cls, tokenizer: Any, chat: Any) -> ChatFormat:
        """From a config's ``ChatSection`` or ``RolloutSection``, whose chat fields are this class's."""
        return cls(tokenizer, **{f.name: getattr(chat, f.name) for f in fields(cls) if f.name != "tokenizer"})

    def __post_init__(self) -> None:
        self.system_prompt = SYSTEM_PROMPT if self.system_prompt is None else self.system_prompt
        self.user_prefix = USER_PREFIX if self.user_prefix is None else self.user_prefix
        ensure_chat_template(self.tokenizer)
        self.tools = tool_schemas(self.stateful) if self.tools_in_prompt else None
        # a template that ignores tools= (SmolLM2's) gets the schemas in the system message instead,
        # and the tool calls of SFT conversations as the text the model writes
        self.tools_in_system = self.tools is not None and not takes_tools(self.tokenizer, self.tools)
        self.calls_in_text = not renders_tool_calls(self.tokenizer)
        self.tool_names = (PYTHON_TOOL, SESSION_TOOL) if self.stateful else (PYTHON_TOOL,)
        self._stub = [*self.problem_messages("1+1"), {"role": "assistant", "content": _MARK}]
        self._stub_text = self.render(self._stub)
        at = self._stub_text.rfind(_MARK)
        if at < 0:
            raise TemplateError("the chat template does not render assistant content verbatim")
        self.after_assistant = self._stub_text[at + len(_MARK) :]  # e.g. "<|im_end|>\n"

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        tools = self.tools
        if self.calls_in_text:
            messages = calls_as_text(messages)
        if self.tools_in_system:
            messages, tools = with_tools_in_system(messages, self.tools), None
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def prompt_ids(self, problem: str) -> list[int]:
        return self.encode(self.render(self.problem_messages(problem), True))

    def problem_messages(self, problem: str) -> list[dict]:
        return problem_messages(problem, self.system_prompt, self.user_prefix)

    def tool_response(self, result: ExecResult | ToolCallError) -> tuple[str, bool]:
        """One tool response, cut in the middle to the character and token limits, and whether the
        model reads less than the code printed (cut here, or by the code environment)."""
        text, cut = cut_middle(result_text(result, self.tool_traceback_lines), self.tool_limit_chars)
        if self.tool_limit_tokens is not None:
            ids = self.encode(text)
            if len(ids) > self.tool_limit_tokens:
                keep = max(1, self.tool_limit_tokens // 2)
                head, tail = self.decode(ids[:keep]), self.decode(ids[-keep:])
                text, cut = f"{head}\n... [{len(ids) - 2 * keep} tokens cut] ...\n{tail}", True
        return text, cut or output_cut(result)

    def tool_turn_text(self, responses: list[str], model_end: str = "") -> str:
        """What follows a generated assistant turn: the rest of its ending the model did not write
        (``model_end``: its stop token's text), the tool messages, and the next generation prompt."""
        tools = [{"role": "tool", "content": r, "name": PYTHON_TOOL} for r in responses]
        full = self.render([*self._stub, *tools], add_generation_prompt=True)
        if not full.startswith(self._stub_text):
            raise TemplateError("the chat template renders earlier turns differently once tool turns follow")
        return self.after_assistant.removeprefix(model_end) + full[len(self._stub_text) :]

    def tool_turn_ids(self, responses: list[str], model_end: str = "") -> list[int]:
        return self.encode(self.tool_turn_text(responses, model_end))

    @cached_property
    def assistant_end(self) -> str:
        """The stop token the model writes to end its turn, as text (``<|im_end|>`` for ChatML)."""
        ends = [self.decode([i]) for i in end_of_turn_ids(self.tokenizer)]
        return max((e for e in ends if e and self.after_assistant.startswith(e)), key=len, default="")

    def conversation_ids(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        """Ids and loss mask (1 on what each assistant turn writes, its stop token included) of a
        conversation, tokenized turn by turn as a rollout builds it (this system prompt if none)."""
        if self.system_prompt and (not messages or messages[0].get("role") != "system"):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        end = self.assistant_end
        eos = [] if end or self.tokenizer.eos_token_id is None else [self.tokenizer.eos_token_id]
        ids: list[int] = []
        mask: list[int] = []
        done = ""
        for i, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            head = self.render(messages[:i], add_generation_prompt=True)
            full = self.render(messages[: i + 1])
            if not (head.startswith(done) and full.startswith(head) and full.endswith(self.after_assistant)):
                raise TemplateError(
                    f"message {i}: the chat template renders earlier turns differently as the conversation "
                    "grows, so it cannot be tokenized turn by turn"
                )
            written = full[len(head) : len(full) - len(self.after_assistant)] + end
            context = self.encode(head[len(done) :])
            model = self.encode(written) + eos
            ids += context + model
            mask += [0] * len(context) + [1] * len(model)
            done = head + written
        if not any(mask):
            raise ValueError("the conversation has no assistant message to learn from")
        return ids, mask
