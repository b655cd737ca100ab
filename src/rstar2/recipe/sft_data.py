"""Non-reasoning SFT conversations: call the tool, read its real output, answer. No reasoning at all:
the paper's first stage teaches only the chat and tool-call format (its AIME24 stays at 3.3%), and
leaves the reasoning to RL. With probability ``error_rate`` the first program is a broken one: the
model sees the environment's real error and a corrected call, so it learns to recover from tool
errors, the noise RL later meets."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any

from ..chat.prompt import problem_messages
from ..chat.tags import ANSWER_CLOSE, ANSWER_OPEN
from ..chat.tool_response import render_result
from ..chat.tools import PYTHON_TOOL
from ..config import DEFAULT_RUN, ChatSection
from ..tasks.generator import Task


def break_code(code: str, rng: random.Random) -> str:
    """A plausible careless version of ``code`` that raises when run."""
    kind = rng.choice(["name", "syntax", "undefined"])
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
    """``opening``, each (program, tool output) as a call and its response, then the answer turn."""
    msgs = list(opening)
    for code, output in calls:
        msgs += [call_message(code), {"role": "tool", "name": PYTHON_TOOL, "content": output}]
    msgs.append({"role": "assistant", "content": f"{ANSWER_OPEN} \\boxed{{{answer}}} {ANSWER_CLOSE}"})
    return msgs


async def build_conversations(
    tasks: Sequence[Task],
    code_env: Any,
    chat: ChatSection,
    *,
    error_rate: float = 0.25,
    seed: int = DEFAULT_RUN.seed,
    on_done: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """One ``{"messages": [...]}`` row per task, every tool output really run by ``code_env``; a task
    whose clean program does not print its answer is dropped. ``on_done``: after each task."""
    rng = random.Random(seed)
    plans = [(t, break_code(t.code, rng) if rng.random() < error_rate else None) for t in tasks]
    limit = asyncio.Semaphore(32)  # programs run at once

    async def run(code: str) -> str:
        async with limit:
            return render_result(await code_env.run(code), chat.tool_limit_chars, chat.tool_traceback_lines)

    async def one(task: Task, broken: str | None) -> dict[str, Any] | None:
        calls = [(broken, await run(broken))] if broken is not None else []
        out = await run(task.code)
        if on_done is not None:
            on_done()
        if out.strip() != str(task.answer):
            return None
        calls.append((task.code, out))
        opening = problem_messages(task.problem, chat.system_prompt, chat.user_prefix)
        return {"messages": conversation(opening, calls, task.answer), "family": task.family}

    rows = await asyncio.gather(*(one(t, b) for t, b in plans))
    return [r for r in rows if r is not None]
