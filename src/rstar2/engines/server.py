"""``rstar2 serve``: an OpenAI-compatible HTTP server over an ``HFEngine``: completions token-in,
token-out as ``OpenAIEngine`` needs them (vLLM's ``return_token_ids`` and
``return_tokens_as_token_ids``), and chat with tool calls in the OpenAI shape for any client."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from ..auth import key_guard
from ..chat.format import end_of_turn_ids, ensure_chat_template
from ..chat.tags import TOOL_CALL_OPEN
from ..chat.tools import ToolCall, parse_tool_calls
from ..config import DEFAULT_ROLLOUT
from .base import Generation, SamplingParams
from .hf import HFEngine
from .served_weights import ServedWeights
from .streaming import TextDeltas, stream, while_there


class _WeightsPath(BaseModel):
    model_path: str
    # SGLang's field; rstar2 serve needs it, so that every token says which policy sampled it
    weight_version: str | None = None


class _Mirror(BaseModel):
    source: str  # the trainer's weight service
    folder: str  # the folder to mirror, the same path here


BAN = -100  # OpenAI's logit bias that bans a token: the one value rstar2 serve's sampler takes


class _Sampling(BaseModel):
    # a field this server does not know is refused, not dropped: a client must not believe it
    # sampled with a setting that was ignored
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(DEFAULT_ROLLOUT.temperature, ge=0)
    top_p: float = Field(DEFAULT_ROLLOUT.top_p, gt=0, le=1)
    top_k: int = -1
    seed: int | None = None
    n: int = Field(1, ge=1, le=64)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    priority: int = 0  # admission order when rows are short: lower first (vLLM's convention)
    logit_bias: dict[str, float] | None = None  # only bans (-100): the tokens never sampled
    stream: bool = False  # server-sent events, a chunk a token (streaming.py)
    stream_options: dict[str, Any] | None = None  # include_usage: a last chunk with the usage
    user: str | None = None  # OpenAI's end-user tag: accepted, not read


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    logprobs: bool | None = None  # type: ignore[assignment]


def banned_ids(logit_bias: dict[str, float] | None, vocab: int) -> tuple[int, ...]:
    """The token ids a ``logit_bias`` bans. Only the ban (-100, OpenAI's "never") is sampled as
    asked; any other bias is refused with a 400, never ignored."""
    out = []
    for key, bias in (logit_bias or {}).items():
        if not key.lstrip("-").isdigit() or not 0 <= int(key) < vocab:
            raise HTTPException(400, f"logit_bias: {key!r} is not a token id in [0, {vocab})")
        if bias != BAN:
            raise HTTPException(
                400, f"logit_bias {{{key!r}: {bias}}}: rstar2 serve takes only {BAN} (a banned token)"
            )
        out.append(int(key))
    return tuple(out)


class Served:
    """What every route shares: the engine, its tokenizer and name, the weights it holds."""

    def __init__(self, engine: HFEngine, tokenizer: Any, model_name: str, weights: ServedWeights) -> None:
        ensure_chat_template(tokenizer)
        self.engine, self.tokenizer, self.model_name, self.weights = engine, tokenizer, model_name, weights
        self.default_stops = end_of_turn_ids(tokenizer)

    def start(
        self, prompt_ids: list[int], req: _Sampling, push: Callable[[int, int, float], None] | None = None
    ) -> Awaitable[list[Generation]]:
        """``req.n`` generations of one prompt, each token to ``push(choice, token, logprob)``
        when given; a setting the server does not take is a 400 now (the bounds of the others were
        checked when the request was read)."""
        stops = () if req.ignore_eos else self.default_stops
        banned = banned_ids(req.logit_bias, len(self.tokenizer))
        params = [
            SamplingParams(
                banned_token_ids=banned,
                max_new_tokens=req.max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=max(0, req.top_k),
                stop_token_ids=tuple(req.stop_token_ids or ()) + tuple(stops),
                seed=None if req.seed is None else req.seed + i,
                priority=req.priority,
            )
            for i in range(req.n)
        ]
        return asyncio.gather(
            *(
                self.engine.generate(prompt_ids, p, None if push is None else functools.partial(push, i))
                for i, p in enumerate(params)
            )
        )

    async def streamed(
        self,
        prompt_ids: list[int],
        req: _Sampling,
        kind: str,
        on_token: Callable[[int, int, float], dict[str, Any]],
        last: Callable[[int, Generation], dict[str, Any]],
        first: dict[str, Any] | None = None,
    ) -> Any:
        """``req``'s answer as server-sent events of ``kind`` chunks (``streaming.stream``), then
        the usage if asked for."""
        wants_usage = (req.stream_options or {}).get("include_usage")
        count = functools.partial(usage, len(prompt_ids)) if wants_usage else None
        start = functools.partial(self.start, prompt_ids, req)
        return await stream(start, self.head(kind), on_token, last, first, count)

    def text_of(self, ids: list[int], stops: tuple[int, ...], skip_special: bool) -> str:
        ids = [i for i in ids if i not in stops]
        return self.tokenizer.decode(
            ids, skip_special_tokens=skip_special, clean_up_tokenization_spaces=False
        )

    def head(self, kind: str) -> dict[str, Any]:
        """The fields an answer (or each of its chunks) starts with: its id, ``kind``, time, model."""
        prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
        return {
            "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
        }

    def response(self, kind: str, choices: list[dict], prompt: int, gens: list[Any]) -> dict[str, Any]:
        return {**self.head(kind), "choices": choices, "usage": usage(prompt, gens)}


def usage(prompt: int, gens: list[Generation]) -> dict[str, int]:
    done = sum(len(g.token_ids) for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


def server_routes(app: FastAPI, s: Served) -> None:
    """Health, KV capacity (SGLang's server info), the model list, and loading new weights."""

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": s.model_name,
            "in_flight": s.engine.in_flight,
            "running": s.engine.running,  # rows in the batch now
            "busy_s": s.engine.stats["busy_s"],  # seconds spent generating (idle share = 1 - busy/wall)
            "generated_tokens": s.engine.stats["generated_tokens"],
            "engine": await s.engine.counters(),  # decode steps, rows, joins, evictions (the trainer's engine/*)
        }

    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        """KV capacity in tokens, under SGLang's key, for the rollout scheduler's ``kv`` policy."""
        info = {"model": s.model_name, "max_total_num_tokens": s.engine.capacity_tokens}
        engine = {"policy_version": s.engine.version, **await s.engine.counters()}
        return {**info, **await asyncio.to_thread(s.weights.held), "engine": engine}

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: _WeightsPath) -> dict[str, Any]:
        """The RL trainer's weight load; the answer states the version and fingerprint held, to check."""
        loaded = await s.weights.load(body.model_path, body.weight_version)
        held = await asyncio.to_thread(s.weights.held)
        return {"success": True, "message": f"loaded {loaded} tensors from {body.model_path}", **held}

    @app.post("/mirror_weights")
    async def mirror_weights(body: _Mirror) -> dict[str, Any]:
        return await s.weights.mirror(body.source, body.folder)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": s.model_name, "object": "model", "owned_by": "rstar2"}]}


def completion_routes(app: FastAPI, s: Served) -> None:
    """``/v1/completions``: text or token ids in; text, token ids and logprobs out (vLLM's extras)."""

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, client: Request) -> Any:
        tok = s.tokenizer
        prompt_ids = (
            req.prompt if isinstance(req.prompt, list) else tok.encode(req.prompt, add_special_tokens=False)
        )
        if any(not 0 <= t < len(tok) for t in prompt_ids):
            raise HTTPException(400, f"prompt token ids must be in [0, {len(tok)})")
        stops = s.default_stops + tuple(req.stop_token_ids or ())
        decode = functools.partial(s.text_of, stops=stops, skip_special=req.skip_special_tokens)

        def logprobs(ids: list[int], lps: list[float]) -> dict[str, Any] | None:
            if req.logprobs is None:
                return None
            as_ids = req.return_tokens_as_token_ids
            shown = [f"token_id:{t}" for t in ids] if as_ids else tok.convert_ids_to_tokens(ids)
            return {"tokens": shown, "token_logprobs": lps, "top_logprobs": None}

        if req.stream:
            deltas = [TextDeltas(decode) for _ in range(req.n)]

            def on_token(i: int, token: int, lp: float) -> dict[str, Any]:
                text = deltas[i].add(token)
                choice = {"text": text, "logprobs": logprobs([token], [lp]), "finish_reason": None}
                if req.return_token_ids:
                    choice["token_ids"] = [token]
                return choice

            def last(i: int, g: Generation) -> dict[str, Any]:
                return {
                    "text": deltas[i].rest(decode(g.token_ids)),
                    "logprobs": None,
                    "finish_reason": g.finish_reason,
                }

            return await s.streamed(list(prompt_ids), req, "text_completion", on_token, last)
        gens = await while_there(s.start(list(prompt_ids), req), client.receive)
        choices = []
        for i, g in enumerate(gens):
            choice: dict[str, Any] = {
                "index": i,
                "text": decode(g.token_ids),
                "finish_reason": g.finish_reason,
                "logprobs": logprobs(g.token_ids, g.logprobs),
            }
            if req.return_token_ids:
                choice["token_ids"] = g.token_ids
                choice["prompt_token_ids"] = list(prompt_ids)
                choice["token_versions"] = g.versions  # rstar2's: the policy version of each token
            choices.append(choice)
        return s.response("text_completion", choices, len(prompt_ids), gens)


def chat_routes(app: FastAPI, s: Served) -> None:
    """``/v1/chat/completions``: messages through the chat template; tool calls in the OpenAI shape."""

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, client: Request) -> Any:
        try:
            text = s.tokenizer.apply_chat_template(
                req.messages, tools=req.tools, tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:  # a template error names what is wrong with the messages
            raise HTTPException(400, f"cannot render the messages: {exc}") from exc
        prompt_ids = s.tokenizer.encode(text, add_special_tokens=False)
        names = tuple(t.get("function", t).get("name", "") for t in req.tools or ())
        decode = functools.partial(s.text_of, stops=s.default_stops, skip_special=False)
        if req.stream:  # a tool call's text is kept back: the last chunk carries the call itself
            deltas = [TextDeltas(decode, hold=TOOL_CALL_OPEN if names else None) for _ in range(req.n)]

            def on_token(i: int, tok: int, lp: float) -> dict[str, Any]:
                return {"delta": {"content": deltas[i].add(tok)}, "finish_reason": None}

            def last(i: int, g: Generation) -> dict[str, Any]:
                whole = decode(g.token_ids)
                message, finish = _assistant_message(whole, names)
                if "tool_calls" in message:
                    calls = [{"index": k, **c} for k, c in enumerate(message["tool_calls"])]
                    return {"delta": {"tool_calls": calls}, "finish_reason": finish}
                return {"delta": {"content": deltas[i].rest(whole)}, "finish_reason": g.finish_reason}

            opening = {"delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            return await s.streamed(prompt_ids, req, "chat.completion.chunk", on_token, last, opening)
        gens = await while_there(s.start(prompt_ids, req), client.receive)
        choices = []
        for i, g in enumerate(gens):
            message, finish = _assistant_message(decode(g.token_ids), names)
            choices.append({"index": i, "message": message, "finish_reason": finish or g.finish_reason})
        return s.response("chat.completion", choices, len(prompt_ids), gens)


def _assistant_message(content: str, tools: tuple[str, ...]) -> tuple[dict[str, Any], str | None]:
    """The OpenAI assistant message of a generated text: its tool calls split out (finish reason
    ``tool_calls``) when tools were offered and it called them."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if not tools or TOOL_CALL_OPEN not in content:
        return message, None
    calls = [c for c in parse_tool_calls(content, tools=tools, max_calls=16).calls if isinstance(c, ToolCall)]
    if not calls:
        return message, None
    message["content"] = content.split(TOOL_CALL_OPEN)[0].rstrip() or None
    message["tool_calls"] = [
        {
            "id": f"call_{uuid.uuid4().hex[:16]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in calls
    ]
    return message, "tool_calls"


def create_app(served: Served, api_key: str | None) -> FastAPI:
    """The server's routes over ``served``; with ``api_key``, only for callers that send it."""
    app = FastAPI(title="rstar2 serve", version="1")
    app.middleware("http")(key_guard(api_key))
    for routes in (server_routes, completion_routes, chat_routes):
        routes(app, served)
    return app


def serve(
    model_dir: Path,
    host: str,
    port: int,
    *,
    name: str | None,
    device: str,
    dtype: str,
    log: Any = print,
    api_key: str | None = None,
    weights_from: list[Path] | None = None,
    fetch_from: str | None = None,
    kind: str = DEFAULT_ROLLOUT.engine.kind,
    **sizes: Any,
) -> None:
    """``rstar2 serve``: the model in the in-process engine ``kind`` names (``engines/kinds.py``:
    ``HFEngine``, or an installed package's, keeping ``LocalEngine``; ``sizes``: its batch and KV
    budget), served.
    Its port is bound first (``listen``: a port taken is a ``CannotListen`` before minutes of
    loading) and answers 503 until the model is loaded (``Loading``); a load that fails stops it
    and is raised here."""
    import threading

    import uvicorn
    from transformers import AutoTokenizer

    from ..local_service import address, listen
    from .kinds import in_process_kind

    sock = listen(host, port)
    url = f"{address(sock)}/v1"
    log(f"rstar2 serve: listening on {url}; loading {model_dir}")
    app = Loading()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    failed: list[BaseException] = []

    def load() -> None:
        try:
            engine = in_process_kind(kind).from_pretrained(model_dir, device=device, dtype=dtype, **sizes)
            # no policy version until a trainer loads its weights: what it samples before is never
            # trained on (a server restarted mid-run serves its starting weights, not the trainer's)
            engine.version = -1
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
            weights = ServedWeights(engine, weights_from, api_key, fetch_from)
            served = Served(engine, tokenizer, name or model_dir.name, weights)
            app.app = create_app(served, api_key)
            log(f"serving {served.model_name} on {url} ({engine.model.device})")
        except BaseException as exc:  # noqa: BLE001 - raised in the main thread, once the server stopped
            failed.append(exc)
            server.should_exit = True

    threading.Thread(target=load, name="load-model", daemon=True).start()
    server.run(sockets=[sock])
    if failed:
        raise failed[0]


class Loading:
    """The ASGI app of ``rstar2 serve`` while its model loads, its port already bound: every request,
    ``GET /health`` too, is a 503 (``Retry-After``) until ``app`` is set, so whoever waits for the
    server (``wait_healthy``) reads 200 only once it can generate."""

    def __init__(self) -> None:
        self.app: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.app is not None:
            return await self.app(scope, receive, send)
        from starlette.responses import JSONResponse

        said = {"status": "loading", "error": "rstar2 serve is loading its model: try again shortly"}
        await JSONResponse(said, status_code=503, headers={"Retry-After": "5"})(scope, receive, send)
