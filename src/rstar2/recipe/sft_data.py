"""Non-reasoning SFT conversations: call the tool, read its output, answer. No reasoning at all.

The paper's first stage teaches only the chat and tool-call format (its AIME24 stays at 3.3%), and
leaves the reasoning to RL. Each conversation here is the problem, one assistant turn that calls
the Python tool with a program, the real output of that program from the code environment, and
an assistant turn with the answer. With probability ``error_rate`` the first program is a broken
one (a typo, a missing parenthesis, a wrong name): the model sees the environment's real error and
a corrected call follows, so it learns to recover from tool errors, the noise RL later meets.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any

from ..chat.prompt import problem_messages
from ..chat.tool_response import render_result
from ..chat.tools import PYTHON_TOOL
from .tasks import Task


def answer_text(answer: int | str) -> str:
    return f"<answer> \\boxed{{{answer}}} </answer>"


def break_code(code: str, rng: random.Random) -> str:
    """A plausible careless version of ``code`` that raises when run."""
    kinds = ["name", "syntax", "undefined"]
    kind = rng.choice(kinds)
    if kind == "name" and "print(" in code:
        return code.replace("print(", "prnt(", 1)
    if kind == "syntax" and code.endswith(")"):
        return code[:-1]
    last = code.splitlines()[-1]
    inner = last[last.index("(") + 1 : -1] if last.startswith("print(") else last
    return code[: len(code) - len(last)] + f"result = {inner}\nprint(answer)"


def call_message(code: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": PYTHON_TOOL, "arguments": {"code": code}}}],
    }


def conversation(opening: list[dict], calls: Sequence[tuple[str, str]], answer: int | str) -> list[dict]:
    """``opening`` (system and user messages), each (program, tool output) as a call and its
    response, then the answer turn."""
    msgs = list(opening)
    for code, output in calls:
        msgs += [call_message(code), {"role": "tool", "name": PYTHON_TOOL, "content": output}]
    msgs.append({"role": "assistant", "content": answer_text(answer)})
    return msgs


async def build_conversations(
    tasks: Sequence[Task],
    code_env: Any,
    *,
    system_prompt: str | None = None,
    user_prefix: str | None = None,
    error_rate: float = 0.25,
    tool_limit_chars: int = 2048,
    traceback_lines: int = 12,
    seed: int = 0,
    concurrency: int = 32,
    on_done: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """One ``{"messages": [...]}`` row per task, every tool output produced by ``code_env`` (the
    code environment). A task whose clean program does not print its answer is dropped.
    ``on_done`` is called after each task (a progress bar)."""
    rng = random.Random(seed)
    plans = [(t, break_code(t.code, rng) if rng.random() < error_rate else None) for t in tasks]
    limit = asyncio.Semaphore(concurrency)

    async def run(code: str) -> str:
        async with limit:
            return render_result(await code_env.run(code), tool_limit_chars, traceback_lines)

    async def one(task: Task, broken: str | None) -> dict[str, Any] | None:
        calls = [(broken, await run(broken))] if broken is not None else []
        out = await run(task.code)
        if on_done is not None:
            on_done()
        if out.strip() != str(task.answer):
            return None
        calls.append((task.code, out))
        msgs = conversation(problem_messages(task.problem, system_prompt, user_prefix), calls, task.answer)
        return {"messages": msgs, "family": task.family}

    rows = await asyncio.gather(*(one(t, b) for t, b in plans))
    return [r for r in rows if r is not None]
