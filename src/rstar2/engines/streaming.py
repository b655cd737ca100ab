"""Streamed answers of ``rstar2 serve`` (``stream: true``), as OpenAI's and vLLM's servers send them:
server-sent events, one ``data: {chunk}`` per sampled token, then a last chunk with the finish
reason (and usage when ``stream_options.include_usage``), then ``data: [DONE]``. The text of each
chunk is what the tokens so far add to the decoded text, so the chunks join to the whole answer."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import HTTPException
from fastapi.responses import StreamingResponse
from starlette.types import Receive

from .base import Generation

DONE = "data: [DONE]\n\n"


def event(chunk: dict[str, Any]) -> str:
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"


class TextDeltas:
    """The text a growing list of tokens adds at each token (``decode``: ids to text). A token that
    ends inside a character waits for the next; with ``hold``, text from where ``hold`` may begin
    is kept back until ``rest`` (a tool call's opening tag, which the last chunk replaces), and so is
    an end that may be its beginning. Only the tokens since the last line break are decoded again
    at each token (as transformers' ``TextStreamer``), so a long answer costs no more per token."""

    def __init__(self, decode: Callable[[list[int]], str], hold: str | None = None) -> None:
        self.decode, self.hold = decode, hold
        self.ids: list[int] = []  # the tokens since the last line break sent
        self.sent = ""  # their text sent so far
        self.before = ""  # the text sent up to that line break

    def add(self, token: int) -> str:
        self.ids.append(token)
        text = self.decode(self.ids)
        if text.endswith("\ufffd") or not text.startswith(self.sent):
            return ""
        if self.hold:  # up to the tag, or short of an end that may begin it
            whole = self.before + text
            at = whole.find(self.hold)
            tail = next((k for k in range(len(self.hold) - 1, 0, -1) if text.endswith(self.hold[:k])), 0)
            text = whole[len(self.before) : at] if at >= 0 else text[: len(text) - tail]
        delta, self.sent = text[len(self.sent) :], text
        if text.endswith("\n") and not (self.hold and self.hold in self.before + text):
            self.before, self.ids, self.sent = self.before + text, [], ""
        return delta

    def rest(self, whole: str) -> str:
        """What ``whole`` (the finished answer's text) adds to what was sent; if decoding the whole
        answer wrote earlier text otherwise, what follows the part they share."""
        return whole[len(os.path.commonprefix([whole, self.before + self.sent])) :]


async def stream(
    start: Callable[[Callable[[int, int, float], None]], Awaitable[list[Generation]]],
    head: dict[str, Any],
    on_token: Callable[[int, int, float], dict[str, Any]],
    last: Callable[[int, Generation], dict[str, Any]],
    first: dict[str, Any] | None = None,
    usage: Callable[[list[Generation]], dict[str, int]] | None = None,
) -> StreamingResponse:
    """The events of the generations ``start(push)`` runs (each token pushed as ``(choice, token,
    logprob)``), each chunk ``head``'s fields and one choice: ``first`` (a choice's opening, e.g. the
    assistant's role) before each choice's first token, ``on_token``'s for each token, ``last``'s for
    each finished generation; then ``usage``'s chunk where given. A request refused before its first
    token is an HTTP error (400: the engine refused it, 503: it holds no whole weights), not a stream
    that ends at once."""
    events: asyncio.Queue = asyncio.Queue()
    done = asyncio.ensure_future(start(lambda i, tok, lp: events.put_nowait((i, tok, lp))))
    done.add_done_callback(lambda _: events.put_nowait(None))
    item = await events.get()
    if item is None:
        await answered(done)  # raises the refusal

    def chunk(i: int, choice: dict[str, Any]) -> str:
        return event({**head, "choices": [{"index": i, **choice}]})

    async def body(item: tuple[int, int, float] | None) -> AsyncIterator[str]:
        opened: set[int] = set()
        try:
            while item is not None:
                if first is not None and item[0] not in opened:
                    opened.add(item[0])
                    yield chunk(item[0], first)
                yield chunk(item[0], on_token(*item))
                item = await events.get()
            try:
                gens = await answered(done)
            except HTTPException as exc:  # after the first token: said in the stream
                yield event({"error": {"message": exc.detail, "code": exc.status_code}})
                yield DONE
                return
            for i, g in enumerate(gens):
                yield chunk(i, last(i, g))
            if usage is not None:
                yield event({**head, "choices": [], "usage": usage(gens)})
            yield DONE
        finally:
            done.cancel()  # a client that went away: nothing left to send to

    return StreamingResponse(body(item), media_type="text/event-stream")


async def while_there(gens: Awaitable[list[Generation]], receive: Receive) -> list[Generation]:
    """``answered(gens)`` for a client waiting for the whole answer, cancelled if it goes away first
    (ASGI's ``http.disconnect``: it closed the connection, or its own timeout fired, as
    ``OpenAIEngine``'s ``server_timeout_s`` does): the rows leave the batch at the next step, as a
    stream's do, instead of decoding the rest of ``max_tokens`` for nobody. The server goes on as
    before: uvicorn does not cancel a request whose client left."""
    done = asyncio.ensure_future(gens)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((done, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this request is cancelled (the server stops)
        gone.cancel()
        left = not done.done()
        if left:
            done.cancel()
    if left:
        raise HTTPException(499, "the client went away before the answer")  # nginx's code: read by nobody
    return await answered(done)


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone: the body was read, so the next message is the disconnect."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def answered(gens: Awaitable[list[Generation]]) -> list[Generation]:
    """The generations, an engine's refusal as an HTTP error (400: refused, 503: no whole weights)."""
    try:
        return await gens
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from exc
    except RuntimeError as exc:  # no whole weights (a load failed half way), or closing
        raise HTTPException(503, str(exc)) from exc
