"""``rstar2 serve``: an OpenAI-compatible HTTP server over an ``HFEngine``.

``/v1/completions`` takes a prompt as text or as token ids and, like vLLM, can return the sampled
token ids (``return_token_ids``) and per-token logprobs with tokens written as ``token_id:N``
(``return_tokens_as_token_ids``): what ``OpenAIEngine`` needs for token-in, token-out rollouts.
``/v1/chat/completions`` renders messages (and ``tools``) through the model's chat template and
returns tool calls in the OpenAI shape, so any OpenAI client can talk to the tiny model.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from ..chat.format import end_of_turn_ids, ensure_chat_template
from ..chat.tags import TOOL_CALL_OPEN
from ..chat.tools import ToolCall, parse_tool_calls
from .base import SamplingParams, weights_fingerprint
from .hf import HFEngine


class _WeightsPath(BaseModel):
    model_path: str


class _Sampling(BaseModel):
    model: str | None = None
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    seed: int | None = None
    n: int = Field(1, ge=1, le=64)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    logprobs: bool | None = None  # type: ignore[assignment]


def create_app(engine: HFEngine, tokenizer: Any, model_name: str) -> FastAPI:
    ensure_chat_template(tokenizer)
    app = FastAPI(title="rstar2 serve", version="1")
    default_stops = end_of_turn_ids(tokenizer)
    dtype = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
    weights: dict[str, Any] = {"version": 0, "path": None, "fingerprint": None, "keys": None}

    def held_weights() -> dict[str, Any]:
        """What the served model holds: load count, folder, and a fingerprint of the tensors the last
        load named, read back from the model (computed when first asked)."""
        if weights["fingerprint"] is None:
            with engine.lock:
                held = engine.model.state_dict()
                keys = weights["keys"] or list(held)
                weights["fingerprint"] = weights_fingerprint({k: held[k] for k in keys})
        return {
            "weights_version": weights["version"],
            "weights_path": weights["path"],
            "weights_fingerprint": weights["fingerprint"],
            "dtype": dtype,
        }

    def params(req: _Sampling, i: int) -> SamplingParams:
        stops = () if req.ignore_eos else default_stops
        try:
            return SamplingParams(
                max_new_tokens=req.max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=max(0, req.top_k),
                stop_token_ids=tuple(req.stop_token_ids or ()) + tuple(stops),
                seed=None if req.seed is None else req.seed + i,
            )
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from exc

    async def generate(prompt_ids: list[int], req: _Sampling) -> list[Any]:
        try:
            return await asyncio.gather(*(engine.generate(prompt_ids, params(req, i)) for i in range(req.n)))
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from exc

    def text_of(ids: list[int], stops: tuple[int, ...], skip_special: bool) -> str:
        ids = [i for i in ids if i not in stops]
        return tokenizer.decode(ids, skip_special_tokens=skip_special, clean_up_tokenization_spaces=False)

    def response(kind: str, prefix: str, choices: list[dict], prompt: int, gens: list[Any]) -> dict[str, Any]:
        done = sum(len(g.token_ids) for g in gens)
        return {
            "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
            "object": kind,
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done},
        }

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": model_name,
            "in_flight": engine.in_flight,
            "busy_s": engine.stats["busy_s"],  # seconds spent generating (idle share = 1 - busy/wall)
            "generated_tokens": engine.stats["generated_tokens"],
        }

    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        """KV capacity in tokens, under SGLang's key, for the rollout scheduler's ``kv`` policy."""
        info = {"model": model_name, "max_total_num_tokens": engine.capacity_tokens}
        return {**info, **await asyncio.to_thread(held_weights)}

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: _WeightsPath) -> dict[str, Any]:
        """Load new weights (a checkpoint folder) into the served model (the RL trainer's call).
        The answer states the fingerprint of what the model now holds, for the trainer to check."""
        from safetensors.torch import load_file

        files = sorted(Path(body.model_path).glob("*.safetensors"))
        if not files:
            raise HTTPException(400, f"no *.safetensors files in {body.model_path}")
        state: dict[str, Any] = {}
        for f in files:
            state.update(load_file(str(f)))
        own = engine.model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise HTTPException(
                400, f"{body.model_path} holds tensors this model does not have: {unknown[:5]}"
            )
        await asyncio.to_thread(engine.update_weights, state)
        weights.update(
            version=weights["version"] + 1, path=body.model_path, fingerprint=None, keys=list(state)
        )
        held = await asyncio.to_thread(held_weights)
        return {"success": True, "message": f"loaded {len(state)} tensors from {body.model_path}", **held}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "rstar2"}]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> dict[str, Any]:
        prompt_ids = (
            req.prompt
            if isinstance(req.prompt, list)
            else tokenizer.encode(req.prompt, add_special_tokens=False)
        )
        if not prompt_ids:
            raise HTTPException(400, "the prompt is empty")
        if any(not 0 <= t < len(tokenizer) for t in prompt_ids):
            raise HTTPException(400, f"prompt token ids must be in [0, {len(tokenizer)})")
        gens = await generate(list(prompt_ids), req)
        stops = default_stops + tuple(req.stop_token_ids or ())
        choices = []
        for i, g in enumerate(gens):
            choice: dict[str, Any] = {
                "index": i,
                "text": text_of(g.token_ids, stops, req.skip_special_tokens),
                "finish_reason": g.finish_reason,
                "logprobs": None,
            }
            if req.logprobs is not None:
                tokens = (
                    [f"token_id:{t}" for t in g.token_ids]
                    if req.return_tokens_as_token_ids
                    else tokenizer.convert_ids_to_tokens(g.token_ids)
                )
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": g.logprobs, "top_logprobs": None}
            if req.return_token_ids:
                choice["token_ids"] = g.token_ids
                choice["prompt_token_ids"] = list(prompt_ids)
            choices.append(choice)
        return response("text_completion", "cmpl", choices, len(prompt_ids), gens)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest) -> dict[str, Any]:
        try:
            text = tokenizer.apply_chat_template(
                req.messages, tools=req.tools, tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:  # a template error names what is wrong with the messages
            raise HTTPException(400, f"cannot render the messages: {exc}") from exc
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
        gens = await generate(prompt_ids, req)
        names = tuple(t.get("function", t).get("name", "") for t in req.tools or ())
        choices = []
        for i, g in enumerate(gens):
            content = text_of(g.token_ids, default_stops, False)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            finish = g.finish_reason
            if names and TOOL_CALL_OPEN in content:
                calls = [
                    c
                    for c in parse_tool_calls(content, tools=names, max_calls=16).calls
                    if isinstance(c, ToolCall)
                ]
                if calls:
                    message["content"] = content.split(TOOL_CALL_OPEN)[0].rstrip() or None
                    message["tool_calls"] = [
                        {
                            "id": f"call_{uuid.uuid4().hex[:16]}",
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                        }
                        for c in calls
                    ]
                    finish = "tool_calls"
            choices.append({"index": i, "message": message, "finish_reason": finish})
        return response("chat.completion", "chatcmpl", choices, len(prompt_ids), gens)

    return app
