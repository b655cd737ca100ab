"""``rstar2 chat``: a model solving problems one at a time, each tool call, its output and the
answer printed as they happen, through the same rollout code as training."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from ..config import RolloutSection
from ..reward.extract import extract_answer
from .build import check_engine_choice, open_rollout


def show_event(out: Any, kind: str, data: dict) -> None:
    """One rollout event on a rich ``Console``: a turn's text, a tool call's outcome, the end."""
    if kind == "generation":
        out.print(f"[bold cyan]assistant (turn {data['turn'] + 1})[/bold cyan]")
        out.print(data["text"], markup=False, highlight=False)
    elif kind == "tool":
        c = data["call"]
        colour = "green" if not c.failed else "red"
        out.print(f"[{colour}]tool {c.name or '?'} → {c.status}[/{colour}]")
        out.print(c.response, markup=False, highlight=False, style="dim")
    elif kind == "done":
        t = data["trajectory"]
        t.answer = t.answer or extract_answer(t.model_text)
        out.print(
            f"[bold]finish:[/bold] {t.finish_reason}  answer: {t.answer or '-'}  "
            f"tokens: {t.response_tokens}  tool calls: {t.num_calls}"
        )


def chat(
    settings: RolloutSection,
    *,
    model: str | None,
    tokenizer: str | None,
    device: str,
    problem: str | None,
    out: Any,
) -> None:
    """Solve ``problem``, or each problem typed at the prompt until an empty line or EOF. A rollout
    that failed (its server refused or is not there) is a ``ServerError``: no answer to show."""
    from ..engines.openai import ServerError

    check_engine_choice(model, settings, tokenizer)

    async def solve(rollout: Any, text: str) -> None:
        t = await rollout.run(text, None, on_event=partial(show_event, out))
        if t.finish_reason == "error":
            raise ServerError(t.verdict)

    async def session() -> None:
        async with open_rollout(settings, model=model, tokenizer=tokenizer, device=device) as rollout:
            if problem:
                await solve(rollout, problem)
                return
            while True:
                try:
                    q = await asyncio.to_thread(input, "problem> ")
                except EOFError:
                    return
                if q.strip() in ("", "exit", "quit"):
                    return
                await solve(rollout, q)

    asyncio.run(session())
