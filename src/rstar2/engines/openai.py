"""``OpenAIEngine``: an OpenAI-compatible completions server (SGLang, ``rstar2 serve``, a vLLM
without its RL routes; ``engines/vllm.py`` speaks to a vLLM started with them).

Token ids go in as the prompt of ``/v1/completions``; the sampled ids come back through vLLM's
``return_token_ids`` (or, on servers without it, from logprob tokens written as ``token_id:N``),
so a rollout never re-tokenizes text the server produced.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

from .base import Generation, SamplingParams


class ServerError(RuntimeError):
    pass


DEFAULT_CAPACITY_TOKENS = 1 << 20  # when neither the config nor the server says


def capacity_from_vllm_metrics(text: str) -> int | None:
    """vLLM's Prometheus ``cache_config_info`` gauge carries ``num_gpu_blocks`` and ``block_size``."""
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            try:
                return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
            except (KeyError, ValueError):
                return None
    return None


def _token_ids(choice: dict[str, Any]) -> list[int]:
    if choice.get("token_ids") is not None:
        return [int(t) for t in choice["token_ids"]]
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return [int(t.split(":", 1)[1]) for t in tokens]
    raise ServerError(
        "the server returned no token ids: it needs vLLM's `return_token_ids` or "
        "`return_tokens_as_token_ids` (vLLM >= 0.10, or `rstar2 serve`)"
    )


def _token_logprobs(choice: dict[str, Any], n: int, server: str) -> list[float]:
    """The log-prob of each sampled token: the behaviour policy the trainer compares with and
    corrects by. A server that returns none (or not one a token) is an error, never filled in."""
    found = (choice.get("logprobs") or {}).get("token_logprobs")
    if not isinstance(found, list) or len(found) != n or any(x is None for x in found):
        got = "none" if not isinstance(found, list) else f"{len(found)} for {n} tokens"
        raise ServerError(
            f"{server} returned no log-prob for each sampled token ({got}); it must answer "
            "`logprobs: 0` with `token_logprobs` (vLLM, SGLang and `rstar2 serve` do)"
        )
    return [float(x) for x in found]


class OpenAIEngine:
    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        name: str | None = None,
        capacity_tokens: int | None = None,
        timeout_s: float = 600.0,
        retries: int = 3,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.name = name or self.base_url
        self.capacity_tokens = capacity_tokens or DEFAULT_CAPACITY_TOKENS
        self.capacity_source = "config" if capacity_tokens else "default"
        self.prefix_cache = True  # vLLM and SGLang reuse a prompt's cached prefix
        self.retries = retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s, headers=headers)
        self.in_flight = 0
        self.send_priority = False  # SamplingParams.priority sent (set by probe_capacity)

    async def probe_capacity(self) -> int:
        """The server's KV capacity in tokens, unless the config set one: SGLang's (and ``rstar2
        serve``'s) ``/get_server_info`` ``max_total_num_tokens``, else vLLM's ``/metrics``; if neither
        answers, the default stays (and ``capacity_source`` says so). Also learns whether the server
        takes ``SamplingParams.priority`` (``rstar2 serve`` does)."""
        try:
            resp = await self._client.get("/get_server_info")
            info = resp.json() if resp.status_code == 200 else {}
            info = info if isinstance(info, dict) else {}
            # rstar2 serve orders its queue by priority; vLLM refuses one unless started with
            # --scheduling-policy priority, so it is sent only where the server says it is ours
            self.send_priority = "engine" in info
            if self.capacity_source != "default":
                return self.capacity_tokens
            if info.get("max_total_num_tokens"):
                self.capacity_tokens, self.capacity_source = (
                    int(info["max_total_num_tokens"]),
                    "server info",
                )
                return self.capacity_tokens
            resp = await self._client.get("/metrics")
            found = capacity_from_vllm_metrics(resp.text) if resp.status_code == 200 else None
            if found:
                self.capacity_tokens, self.capacity_source = found, "vllm metrics"
        except (httpx.HTTPError, ValueError):
            pass
        return self.capacity_tokens

    async def _model(self) -> str:
        if self.model is None:
            try:
                data = (await self._client.get("/v1/models")).raise_for_status().json()
                self.model = data["data"][0]["id"]
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
                raise ServerError(f"{self.base_url}/v1/models: {type(exc).__name__}: {exc}") from exc
        return self.model

    def body(self, prompt_ids: list[int], params: SamplingParams, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(prompt_ids),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed
        if params.banned_token_ids:
            body["logit_bias"] = {str(t): -100 for t in params.banned_token_ids}
        if self.send_priority and params.priority:
            body["priority"] = params.priority
        return body

    path = "/v1/completions"  # where a request goes (VLLMEngine: vLLM's token-in, token-out route)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        self.in_flight += 1
        try:
            answer = await self._request(self.body(prompt_ids, params, await self._model()))
            return self.parse(answer["choices"][0])
        finally:
            self.in_flight -= 1

    async def _request(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``self.path``, retried with back-off when the server cannot be reached
        or answers 5xx; its JSON answer, or a ``ServerError``."""
        delay = 0.5
        for attempt in range(self.retries + 1):
            try:
                resp = await self._client.post(self.path, json=body)
            except httpx.TransportError as exc:
                if attempt == self.retries:
                    raise ServerError(f"{self.base_url} unreachable: {exc}") from exc
            else:
                if resp.status_code == 200:
                    return resp.json()
                if resp.status_code < 500 or attempt == self.retries:
                    raise ServerError(f"{self.base_url} answered {resp.status_code}: {resp.text[:500]}")
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def parse(self, choice: dict[str, Any]) -> Generation:
        ids = _token_ids(choice)
        logprobs = _token_logprobs(choice, len(ids), self.base_url)
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        versions = choice.get("token_versions")  # rstar2 serve says which policy sampled each
        if not (isinstance(versions, list) and len(versions) == len(ids)):
            versions = None
        return Generation(ids, logprobs, finish, versions)  # type: ignore[arg-type]

    async def counters(self) -> dict[str, Any] | None:
        """The server's engine counters (``rstar2 serve``'s ``/health``), or None where it has none."""
        try:
            resp = await self._client.get("/health")
            found = resp.json().get("engine") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return found if isinstance(found, dict) else None

    async def update_weights(self, model_dir: str, endpoint: str, version: int) -> dict[str, Any]:
        """Ask the server to load new weights from ``model_dir`` (a checkpoint folder it can read);
        returns the server's answer (``rstar2 serve`` adds ``weights_version``, ``weights_fingerprint``
        and ``dtype``).

        The endpoint is SGLang's (``POST /update_weights_from_disk`` with ``{"model_path": …}``),
        which ``rstar2 serve`` also offers; ``version`` (the trainer's update count) goes as SGLang's
        ``weight_version``, and ``rstar2 serve`` then says which version sampled each token (vLLM's
        own routes are ``VLLMEngine``'s). A refusal (an error status, or ``"success": false`` as SGLang answers)
        raises ``ServerError``. Requests in flight on ``rstar2 serve`` continue under the new
        weights."""
        what = f"{self.base_url}{endpoint} could not load {model_dir}"
        body: dict[str, Any] = {"model_path": str(model_dir), "weight_version": str(version)}
        answer = await self._call("POST", endpoint, what, json=body)
        if answer.get("success") is False:
            raise ServerError(f"{what}: {answer.get('message', answer)}")
        return answer

    async def _call(self, method: str, path: str, what: str | None = None, **kw: Any) -> dict[str, Any]:
        """``method`` ``path``; its JSON object answer ({} if none). No answer, or an error status,
        is a ``ServerError`` that starts with ``what`` (default: the URL). A kept-alive connection
        the server closed as the request went out is tried once more (the control routes these
        calls reach can be repeated)."""
        what = what or f"{self.base_url}{path}"
        try:
            try:
                resp = await self._client.request(method, path, **kw)
            except httpx.RemoteProtocolError:
                resp = await self._client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ServerError(f"{what}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise ServerError(f"{what}: answered {resp.status_code}: {resp.text[:300]}")
        try:
            answer = resp.json()
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}

    async def close(self) -> None:
        await self._client.aclose()
