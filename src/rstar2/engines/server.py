"""``rstar2 serve``: an OpenAI-compatible HTTP server over an ``HFEngine``: completions token-in,
token-out as ``OpenAIEngine`` needs them (vLLM's ``return_token_ids`` and
``return_tokens_as_token_ids``), and chat with tool calls in the OpenAI shape for any client."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from ..adapters import adapter_weights, base_names, is_adapter
from ..auth import FolderRefused, allowed_folder, key_guard, opened_folder
from ..chat.format import end_of_turn_ids, ensure_chat_template
from ..chat.tags import TOOL_CALL_OPEN
from ..chat.tools import ToolCall, parse_tool_calls
from ..config import DEFAULT_ROLLOUT
from .base import Generation, SamplingParams, weights_fingerprint
from .hf import HFEngine
from .streaming import TextDeltas, stream, while_there

# For tests alone: from this load on (1: the first), a load is answered as done, with the version
# and the fingerprint of the tensors sent, while the model keeps its weights: the server that says
# and does not do, which the trainer's content check must catch (tests/rl/test_content_check.py).
PRETEND_LOADS_FROM = "RSTAR2_TEST_PRETEND_LOADS_FROM"


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
    """What every route shares: the engine, its tokenizer and name, the weights held, where from."""

    def __init__(
        self,
        engine: HFEngine,
        tokenizer: Any,
        model_name: str,
        weights_from: list[Path] | None = None,
        api_key: str | None = None,
        fetch_from: str | None = None,
    ) -> None:
        ensure_chat_template(tokenizer)
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.weights_from = list(weights_from or [])
        self.api_key = api_key  # also what it shows the trainer's weight service (a launch's one key)
        self.fetch_from = fetch_from  # the one weight service /mirror_weights fetches from
        self.default_stops = end_of_turn_ids(tokenizer)
        self.dtype = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
        # loads so far, the last one's folder, the tensors it named and their fingerprint (None: not yet)
        self.weights: dict[str, Any] = {"loads": 0, "path": None, "fingerprint": None, "keys": None}

    def held_weights(self) -> dict[str, Any]:
        """What the served model holds: policy version, loads, folder, and a fingerprint of the
        tensors the last load named, read back from the model (computed when first asked)."""
        w = self.weights
        if w["fingerprint"] is None:
            with self.engine.paused():
                model = self.engine.model
                if w.get("adapter"):  # the adapter's tensors, under the names of its folder
                    held = adapter_weights(model)
                else:  # the base's tensors under its own names, also while an adapter is held
                    state = model.state_dict()
                    held = {plain: state[own] for plain, own in base_names(model).items()}
                w["fingerprint"] = weights_fingerprint({k: held[k] for k in w["keys"] or list(held)})
        return {
            "weights_version": self.engine.version,
            "weights_loads": w["loads"],
            "weights_path": w["path"],
            "weights_fingerprint": w["fingerprint"],
            "dtype": self.dtype,
        }

    async def load(self, folder: str, version: str | None) -> int:
        """The safetensors of ``folder`` written into the model as policy ``version``; how many
        tensors. A folder outside ``--weights-from`` is refused before anything is read (403); one
        whose tensors do not fit, from their headers, before their data is (400); a load that fails
        half way (500) leaves the engine refusing requests until one succeeds. The files read are
        those checked: each opened once and checked open (``auth.opened_folder``)."""
        try:
            folder = str(allowed_folder(folder, self.weights_from))
        except FolderRefused as exc:
            raise HTTPException(403, str(exc)) from exc
        if not (version or "").isdigit():
            raise HTTPException(
                400,
                f"weight_version {version!r}: give the policy version of these weights "
                '(a count of updates, e.g. "0"): every token sampled says which version sampled it',
            )
        if self.weights["loads"] + 1 >= int(os.environ.get(PRETEND_LOADS_FROM) or 1 << 62):
            return await asyncio.to_thread(self.pretend_load, folder, int(version))
        try:
            with opened_folder(Path(folder), self.weights_from) as private:
                return await self.load_opened(folder, private, int(version))
        except FolderRefused as exc:
            raise HTTPException(403, str(exc)) from exc

    async def load_opened(self, folder: str, private: Path, version: int) -> int:
        """``load`` from ``private``, the folder of ``folder``'s files opened and checked."""
        from safetensors.torch import load_file

        if is_adapter(private):  # an adapter over the base weights held (model.lora)
            try:
                loaded = await asyncio.to_thread(self.engine.update_adapter, private, version)
            except ValueError as exc:  # nothing was written
                raise HTTPException(400, f"{folder}: {exc}; nothing was loaded") from exc
            except Exception as exc:
                self.weights.update(fingerprint=None, keys=None)
                raise HTTPException(500, f"{folder}: {exc}") from exc
            self.weights.update(
                loads=self.weights["loads"] + 1, path=folder, fingerprint=None, keys=None, adapter=True
            )
            return loaded
        files = sorted(private.glob("*.safetensors"))
        if not files:
            raise HTTPException(400, f"no *.safetensors files in {folder}")
        misfits = await asyncio.to_thread(self.misfits, files)
        if misfits:
            raise HTTPException(
                400, f"{folder}: tensors that do not fit the served model: {misfits[:5]}; nothing was loaded"
            )
        state: dict[str, Any] = {}
        for f in files:
            state.update(await asyncio.to_thread(load_file, str(f)))
        try:
            await asyncio.to_thread(self.engine.update_weights, state, version)
        except ValueError as exc:  # nothing was written
            raise HTTPException(400, f"{folder}: {exc}") from exc
        except Exception as exc:  # written in part: what it holds is no longer what was fingerprinted
            self.weights.update(fingerprint=None, keys=None)
            raise HTTPException(500, f"{folder}: {exc}") from exc
        self.weights.update(
            loads=self.weights["loads"] + 1, path=folder, fingerprint=None, keys=list(state), adapter=False
        )
        return len(state)

    def pretend_load(self, folder: str, version: int) -> int:
        """For tests alone (``PRETEND_LOADS_FROM``): the answer of a load, with the version and the
        fingerprint of the tensors sent, while the model keeps its weights."""
        from safetensors.torch import load_file

        sent = {
            k: v for f in sorted(Path(folder).glob("*.safetensors")) for k, v in load_file(str(f)).items()
        }
        self.engine.invalidate(version)
        self.weights.update(
            loads=self.weights["loads"] + 1,
            path=folder,
            fingerprint=weights_fingerprint(sent, self.dtype),
            keys=list(sent),
            adapter=is_adapter(folder),
        )
        return len(sent)

    def misfits(self, files: list[Path]) -> list[str]:
        """The tensors of ``files`` the model has not, or has in another shape (from their headers)."""
        from safetensors import safe_open

        model = self.engine.model
        state = model.state_dict()
        held = {plain: tuple(state[own].shape) for plain, own in base_names(model).items()}
        out = []
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    shape = tuple(fh.get_slice(key).get_shape())
                    if held.get(key) != shape:
                        served = list(held[key]) if key in held else "none"
                        out.append(f"{key} {list(shape)} (served: {served})")
        return out

    def params(self, req: _Sampling, i: int) -> SamplingParams:
        stops = () if req.ignore_eos else self.default_stops
        try:
            return SamplingParams(
                banned_token_ids=banned_ids(req.logit_bias, len(self.tokenizer)),
                max_new_tokens=req.max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=max(0, req.top_k),
                stop_token_ids=tuple(req.stop_token_ids or ()) + tuple(stops),
                seed=None if req.seed is None else req.seed + i,
                priority=req.priority,
            )
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from exc

    def start(
        self, prompt_ids: list[int], req: _Sampling, push: Callable[[int, int, float], None] | None = None
    ) -> Awaitable[list[Generation]]:
        """``req.n`` generations of one prompt, each token to ``push(choice, token, logprob)``
        when given; a setting the server does not take is a 400 now."""
        params = [self.params(req, i) for i in range(req.n)]
        return asyncio.gather(
            *(
                self.engine.generate(prompt_ids, p, None if push is None else functools.partial(push, i))
                for i, p in enumerate(params)
            )
        )

    async def generate(self, prompt_ids: list[int], req: _Sampling, client: Request) -> list[Generation]:
        """``req.n`` whole generations; a request the engine refuses is a 400; stopped if the client
        goes away first (``while_there``)."""
        return await while_there(self.start(prompt_ids, req), client.receive)

    async def streamed(
        self,
        prompt_ids: list[int],
        req: _Sampling,
        kind: str,
        on_token: Callable[[int, int, float], dict[str, Any]],
        last: Callable[[int, Generation], dict[str, Any]],
        first: dict[str, Any] | None = None,
    ) -> Any:
        """``req``'s answer as server-sent events of ``kind`` chunks: ``first`` (a choice's opening,
        e.g. the assistant's role) before each choice's first token, ``on_token``'s choice for each
        token, ``last``'s for each finished generation, then the usage if asked for."""
        prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
        head = {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time())}
        head["model"] = self.model_name
        opened: set[int] = set()

        def token_chunks(i: int, tok: int, lp: float) -> list[dict[str, Any]]:
            chunks = [] if first is None or i in opened else [{**head, "choices": [{"index": i, **first}]}]
            opened.add(i)
            return [*chunks, {**head, "choices": [{"index": i, **on_token(i, tok, lp)}]}]

        def end_chunks(gens: list[Generation]) -> list[dict[str, Any]]:
            chunks = [{**head, "choices": [{"index": i, **last(i, g)}]} for i, g in enumerate(gens)]
            if (req.stream_options or {}).get("include_usage"):
                chunks.append({**head, "choices": [], "usage": usage(len(prompt_ids), gens)})
            return chunks

        return await stream(lambda push: self.start(prompt_ids, req, push), token_chunks, end_chunks)

    def text_of(self, ids: list[int], stops: tuple[int, ...], skip_special: bool) -> str:
        ids = [i for i in ids if i not in stops]
        return self.tokenizer.decode(
            ids, skip_special_tokens=skip_special, clean_up_tokenization_spaces=False
        )

    def response(
        self, kind: str, prefix: str, choices: list[dict], prompt: int, gens: list[Any]
    ) -> dict[str, Any]:
        return {
            "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": usage(prompt, gens),
        }


def usage(prompt: int, gens: list[Generation]) -> dict[str, int]:
    done = sum(len(g.token_ids) for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


def server_routes(s: Served) -> APIRouter:
    """Health, KV capacity (SGLang's server info), the model list, and loading new weights."""
    router = APIRouter()

    @router.get("/health")
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

    @router.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        """KV capacity in tokens, under SGLang's key, for the rollout scheduler's ``kv`` policy."""
        info = {"model": s.model_name, "max_total_num_tokens": s.engine.capacity_tokens}
        engine = {"policy_version": s.engine.version, **await s.engine.counters()}
        return {**info, **await asyncio.to_thread(s.held_weights), "engine": engine}

    @router.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: _WeightsPath) -> dict[str, Any]:
        """The RL trainer's weight load; the answer states the version and fingerprint held, to check."""
        loaded = await s.load(body.model_path, body.weight_version)
        held = await asyncio.to_thread(s.held_weights)
        return {"success": True, "message": f"loaded {loaded} tensors from {body.model_path}", **held}

    @router.post("/mirror_weights")
    async def mirror_weights(body: _Mirror) -> dict[str, Any]:
        """A folder of the trainer's weight service copied here, checked, before it is loaded
        (``weight_transfer``: engines without the trainer's filesystem)."""
        from ..weight_transfer import MirrorError, mirror

        try:
            return await mirror(body.source, body.folder, s.weights_from, s.api_key, pinned=s.fetch_from)
        except FolderRefused as exc:
            raise HTTPException(403, str(exc)) from None
        except MirrorError as exc:
            raise HTTPException(502, str(exc)) from None

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": s.model_name, "object": "model", "owned_by": "rstar2"}]}

    return router


def completion_routes(s: Served) -> APIRouter:
    """``/v1/completions``: text or token ids in; text, token ids and logprobs out (vLLM's extras)."""
    router = APIRouter()

    @router.post("/v1/completions")
    async def completions(req: CompletionRequest, client: Request) -> Any:
        tok = s.tokenizer
        prompt_ids = (
            req.prompt if isinstance(req.prompt, list) else tok.encode(req.prompt, add_special_tokens=False)
        )
        if not prompt_ids:
            raise HTTPException(400, "the prompt is empty")
        if any(not 0 <= t < len(tok) for t in prompt_ids):
            raise HTTPException(400, f"prompt token ids must be in [0, {len(tok)})")
        stops = s.default_stops + tuple(req.stop_token_ids or ())
        if req.stream:
            deltas = [
                TextDeltas(functools.partial(s.text_of, stops=stops, skip_special=req.skip_special_tokens))
                for _ in range(req.n)
            ]

            def on_token(i: int, token: int, lp: float) -> dict[str, Any]:
                choice: dict[str, Any] = {
                    "text": deltas[i].add(token),
                    "logprobs": None,
                    "finish_reason": None,
                }
                if req.logprobs is not None:
                    shown = (
                        f"token_id:{token}"
                        if req.return_tokens_as_token_ids
                        else tok.convert_ids_to_tokens(token)
                    )
                    choice["logprobs"] = {"tokens": [shown], "token_logprobs": [lp], "top_logprobs": None}
                if req.return_token_ids:
                    choice["token_ids"] = [token]
                return choice

            def last(i: int, g: Generation) -> dict[str, Any]:
                whole = s.text_of(g.token_ids, stops, req.skip_special_tokens)
                return {"text": deltas[i].rest(whole), "logprobs": None, "finish_reason": g.finish_reason}

            return await s.streamed(list(prompt_ids), req, "text_completion", on_token, last)
        gens = await s.generate(list(prompt_ids), req, client)
        choices = []
        for i, g in enumerate(gens):
            choice: dict[str, Any] = {
                "index": i,
                "text": s.text_of(g.token_ids, stops, req.skip_special_tokens),
                "finish_reason": g.finish_reason,
                "logprobs": None,
            }
            if req.logprobs is not None:
                tokens = (
                    [f"token_id:{t}" for t in g.token_ids]
                    if req.return_tokens_as_token_ids
                    else tok.convert_ids_to_tokens(g.token_ids)
                )
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": g.logprobs, "top_logprobs": None}
            if req.return_token_ids:
                choice["token_ids"] = g.token_ids
                choice["prompt_token_ids"] = list(prompt_ids)
                choice["token_versions"] = g.versions  # rstar2's: the policy version of each token
            choices.append(choice)
        return s.response("text_completion", "cmpl", choices, len(prompt_ids), gens)

    return router


def chat_routes(s: Served) -> APIRouter:
    """``/v1/chat/completions``: messages through the chat template; tool calls in the OpenAI shape."""
    router = APIRouter()

    @router.post("/v1/chat/completions")
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
        gens = await s.generate(prompt_ids, req, client)
        choices = []
        for i, g in enumerate(gens):
            message, finish = _assistant_message(s.text_of(g.token_ids, s.default_stops, False), names)
            choices.append({"index": i, "message": message, "finish_reason": finish or g.finish_reason})
        return s.response("chat.completion", "chatcmpl", choices, len(prompt_ids), gens)

    return router


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


def create_app(
    engine: HFEngine,
    tokenizer: Any,
    model_name: str,
    *,
    api_key: str | None = None,
    weights_from: list[Path] | None = None,
    fetch_from: str | None = None,
) -> FastAPI:
    """The server's routes over ``engine``; with ``api_key``, only for callers that send it; weight
    loads only from under ``weights_from``."""
    served = Served(engine, tokenizer, model_name, weights_from, api_key, fetch_from)
    app = FastAPI(title="rstar2 serve", version="1")
    app.middleware("http")(key_guard(api_key))
    for routes in (server_routes, completion_routes, chat_routes):
        app.include_router(routes(served))
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
            model_name = name or model_dir.name
            access = {"api_key": api_key, "weights_from": weights_from, "fetch_from": fetch_from}
            app.app = create_app(engine, AutoTokenizer.from_pretrained(str(model_dir)), model_name, **access)
            log(f"serving {model_name} on {url} ({engine.model.device})")
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
