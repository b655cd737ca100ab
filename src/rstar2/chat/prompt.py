"""The words the policy reads (the rStar2-Agent report's format, rstar2's wording): the system
prompt, the user prefix, and ``CHATML_TEMPLATE``, for tokenizers without a chat template."""

from __future__ import annotations

import json

SYSTEM_PROMPT = (
    "You are a careful problem solver. Work the problem out step by step before answering: put your "
    "reasoning inside <reason> </reason> and your final answer inside <answer> </answer>, for example "
    "<reason> ... </reason> <answer> The result is \\boxed{42}. </answer>. You may reason several "
    "times, and check your work with the tools between reasoning steps, but give exactly one answer, "
    "with the final result in \\boxed{}."
)

USER_PREFIX = (
    "Give your final answer inside <answer> </answer>; the result is read from the \\boxed{} in it. "
    "Here is the problem:\n"
)

# The tool section's words before and after the schemas (one a line), as both renderings below write them
TOOLS_INTRO = (
    "# Tools\n\nYou can call the functions below to help you. Their signatures, as JSON, are listed "
    "inside <tools></tools>:\n<tools>"
)
CALL_FORMAT = (
    "</tools>\n\nTo call a function, write a JSON object with its name and arguments inside "
    '<tool_call></tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)

# ChatML with tools. Consecutive tool messages are answered in one user turn, each inside
# <tool_response>; the tool section is appended to the system message.
CHATML_TEMPLATE = (
    # Written for Hugging Face's Jinja settings (trim_blocks: a newline right after a tag is
    # dropped), so every newline that must stay is an expression: {{ nl }}.
    "{% set nl = '\\n' %}{% set ns = namespace(sys='') %}"
    "{% if messages and messages[0]['role'] == 'system' %}{% set ns.sys = messages[0]['content'] %}{% endif %}"
    "{% if tools %}"
    "<|im_start|>system{{ nl }}{% if ns.sys %}{{ ns.sys }}{{ nl }}{{ nl }}{% endif %}"
    + TOOLS_INTRO.replace("\n", "{{ nl }}")
    + "{% for tool in tools %}{{ nl }}{{ tool | tojson }}{% endfor %}{{ nl }}"
    + CALL_FORMAT.replace("\n", "{{ nl }}")
    + "<|im_end|>{{ nl }}"
    "{% elif ns.sys %}<|im_start|>system{{ nl }}{{ ns.sys }}<|im_end|>{{ nl }}{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}"
    "{% if not loop.first %}<|im_start|>system{{ nl }}{{ m['content'] }}<|im_end|>{{ nl }}{% endif %}"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ nl }}<tool_response>{{ nl }}{{ m['content'] }}{{ nl }}</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>{{ nl }}{% endif %}"
    "{% else %}"
    "<|im_start|>{{ m['role'] }}{{ nl }}{{ m['content'] or '' }}"
    "{% for call in m.get('tool_calls') or [] %}"
    "{% set f = call['function'] if call['function'] is defined else call %}"
    '{{ nl }}<tool_call>{{ nl }}{"name": "{{ f[\'name\'] }}", "arguments": '
    "{{ f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) }}}{{ nl }}</tool_call>"
    "{% endfor %}"
    "<|im_end|>{{ nl }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ nl }}{% endif %}"
)

CHATML_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


def tools_section(tools: list[dict]) -> str:
    """The tool schemas and the call format as text, in the words of ``CHATML_TEMPLATE``'s section:
    what goes into the system message for a chat template that takes no ``tools=`` (SmolLM2's)."""
    listed = "\n".join(json.dumps(t) for t in tools)
    return f"{TOOLS_INTRO}\n{listed}\n{CALL_FORMAT}"


def problem_messages(
    problem: str, system_prompt: str | None = None, user_prefix: str | None = None
) -> list[dict]:
    """The opening of a conversation about one problem. ``None`` takes rstar2's default words
    (``SYSTEM_PROMPT``, ``USER_PREFIX``); an empty string leaves them out, as in the configs."""
    system_prompt = SYSTEM_PROMPT if system_prompt is None else system_prompt
    user_prefix = USER_PREFIX if user_prefix is None else user_prefix
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": user_prefix + problem.strip()})
    return messages
