"""The text the tiny tokenizer learns its merges from: conversations in the recipe's own chat format
(problems, tool calls, outputs, errors, answers), so its tokens fit what the model will read and write."""

from __future__ import annotations

import random

from ..tasks.generator import generate
from .spec import Recipe


def tiny_corpus(recipe: Recipe, count: int = 1500) -> list[str]:
    """``count`` rendered conversations; tool outputs are written, not run: only their wording matters."""
    from ..chat.prompt import problem_messages
    from ..chat.tool_response import render_result
    from ..sandbox.result import ExecResult
    from .sft_data import break_code, conversation
    from .tiny_model import build_tokenizer

    render = build_tokenizer(["x"], 260)  # a template renderer only
    chat = recipe.chat
    error = render_result(
        ExecResult(status="error", stderr="NameError: name 'x' is not defined"),
        chat.tool_limit_chars,
        chat.tool_traceback_lines,
    )
    rng = random.Random(recipe.seed)
    texts = []
    for t in generate(count, digits=(1, 4), seed=recipe.seed):
        calls = [(break_code(t.code, rng), error)] if rng.random() < 0.3 else []
        calls.append((t.code, str(t.answer)))
        msgs = conversation(
            problem_messages(t.problem, chat.system_prompt, chat.user_prefix), calls, t.answer
        )
        texts.append(render.apply_chat_template(msgs, tokenize=False))
    return texts
