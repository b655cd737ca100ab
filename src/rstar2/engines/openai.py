"""``OpenAIEngine``: an OpenAI-compatible completions server (SGLang, ``rstar2 serve``, a vLLM
without its RL routes). Token ids go in as the prompt and come back through ``return_token_ids``
(or logprob tokens written as ``token_id:N``): a rollout never re-tokenizes the server's text."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

from ..auth import client_headers
from ..config import DEFAULT_ROLLOUT
from .base import Generation, SamplingParams, WeightUpdate


class ServerError(RuntimeError):
    def __init__(self, *args: Any, status: int | None = None) -> None:
        super().__init__(*args)
        self.status = status  # the HTTP status the server answered (None: it gave none)


class RequestRefused(ServerError, ValueError):
    """The server answered 4xx: the request (or its key) is wrong, not the server; retrying it on
    another engine, or bringing this one back, would not help."""


def stated_number(value: Any) -> int | None:
    """A version label as a policy version (a count of updates), or None (``default``, missing)."""
    return int(str(value)) if str(value).isdigit() else None


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


async def get_object(client: httpx.AsyncClient, path: str, key: str | None = None, **kw: Any) -> dict | None:
    """The JSON object ``GET path`` answers (or the one under its ``key``); None where there is none.
    A refused key is an error: the server is there, rstar2 is not let in."""
    try:
        resp = await client.get(path, **kw)
    except httpx.HTTPError:
        return None
    if resp.status_code == 401:
        raise ServerError(
            f"{client.base_url} refused rstar2's request (401): set $RSTAR2_API_KEY to the server's API key"
        )
    try:
        found = resp.json() if resp.status_code == 200 else None
    except ValueError:
        return None
    if key is not None and isinstance(found, dict):
        found = found.get(key)
    return found if isinstance(found, dict) else None


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
    """Any OpenAI-compatible server (SGLang, ``rstar2 serve``, a vLLM without its RL routes): the
    last kind ``engines/kinds.py`` tries."""

    local = False

    @classmethod
    async def serves(cls, url: str) -> bool:
        return True

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        name: str | None = None,  # in logs and faults (default: the URL)
        capacity_tokens: int | None = None,
        timeout_s: float = DEFAULT_ROLLOUT.engine.server_timeout_s,
        retries: int = 3,
        reload_path: str = DEFAULT_ROLLOUT.engine.reload_path,
        weights_url: str | None = None,
        api_key: str | None = None,  # default: $RSTAR2_API_KEY
    ) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.weights_url = weights_url  # the trainer's weight service, where the server fetches folders
        self.reload_path = reload_path  # the route that loads a model folder (SGLang's; rstar2 serve's)
        self.model = model
        self.name = name or self.base_url
        self.capacity_tokens = capacity_tokens or DEFAULT_CAPACITY_TOKENS
        self.capacity_source = "config" if capacity_tokens else "default"
        self.prefix_cache = True  # vLLM and SGLang reuse a prompt's cached prefix
        self.retries = retries
        self._client = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout_s, headers=client_headers(api_key)
        )
        self.in_flight = 0
        # set by probe_capacity: "tokens" (rstar2 serve, vLLM), "stated" (SGLang's /get_weight_version)
        self.version_source: str | None = None
        self.send_priority = False  # SamplingParams.priority sent (set by probe_capacity)
        self.send_seed = True  # SamplingParams.seed sent (VLLMEngine: not to a CPU server)

    async def probe_capacity(self) -> int:
        """The server's KV capacity in tokens, unless the config set one: SGLang's (and ``rstar2
        serve``'s) ``/get_server_info``, else vLLM's ``/metrics``, else the default
        (``capacity_source`` says which); and whether it takes ``SamplingParams.priority``."""
        info = await get_object(self._client, "/get_server_info") or {}
        # rstar2 serve orders its queue by priority; vLLM refuses one unless started with
        # --scheduling-policy priority, so it is sent only where the server says it is ours
        self.send_priority = "engine" in info
        stated = await get_object(self._client, "/get_weight_version") or {}
        self.version_source = (
            "tokens" if "engine" in info else "stated" if "weight_version" in stated else None
        )
        if self.capacity_source != "default":
            return self.capacity_tokens
        try:
            if info.get("max_total_num_tokens"):
                self.capacity_tokens, self.capacity_source = int(info["max_total_num_tokens"]), "server info"
                return self.capacity_tokens
            resp = await self._client.get("/metrics")
            found = capacity_from_vllm_metrics(resp.text) if resp.status_code == 200 else None
            if found:
                self.capacity_tokens, self.capacity_source = found, "vllm metrics"
        except (httpx.HTTPError, ValueError):
            pass
        return self.capacity_tokens

    async def _stated(self) -> int | None:
        """The policy version the server says it holds now (SGLang's ``/get_weight_version``)."""
        found = await get_object(self._client, "/get_weight_version")
        return stated_number((found or {}).get("weight_version"))

    async def _model(self) -> str:
        if self.model is None:
            try:
                data = (await self._client.get("/v1/models")).raise_for_status().json()
                self.model = data["data"][0]["id"]
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
                raise ServerError(f"{self.base_url}/v1/models: {type(exc).__name__}: {exc}") from exc
        return self.model

    def sampling(self, params: SamplingParams) -> dict[str, Any]:
        """The sampling fields as vLLM, SGLang and ``rstar2 serve`` all take them: the sampled
        token's log-prob, special tokens kept in the text, banned ids as a -100 bias."""
        sampling: dict[str, Any] = {
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "logprobs": 0,
            "skip_special_tokens": False,
        }
        if params.stop_token_ids:
            sampling["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None and self.send_seed:
            sampling["seed"] = params.seed
        if params.banned_token_ids:
            sampling["logit_bias"] = {str(t): -100 for t in params.banned_token_ids}
        return sampling

    def body(self, prompt_ids: list[int], params: SamplingParams, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "prompt": list(prompt_ids), **self.sampling(params)}
        body.update(return_token_ids=True, return_tokens_as_token_ids=True)
        if self.send_priority and params.priority:
            body["priority"] = params.priority
        return body

    path = "/v1/completions"  # where a request goes (VLLMEngine: vLLM's token-in, token-out route)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        self.in_flight += 1
        try:
            body = self.body(prompt_ids, params, await self._model())
            before = await self._stated() if self.version_source == "stated" else None
            answer = await self._call("POST", self.path, json=body, retries=self.retries)
            gen = self.parse_answer(answer)
            if self.version_source == "stated":  # one version for every token, only if it held throughout
                after = await self._stated()
                gen.versions = [before if before is not None and before == after else -1] * len(gen.token_ids)
            return gen
        finally:
            self.in_flight -= 1

    def parse_answer(self, answer: dict[str, Any]) -> Generation:
        return self.parse(answer["choices"][0])

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
        return await get_object(self._client, "/health", "engine")

    async def folder_of(self, update: WeightUpdate) -> str:
        """The folder a server loads (with ``weights_url``: first mirrored onto its disk from the
        trainer's weight service); an update of tensors is not one it can take."""
        if update.folder is None:
            raise ValueError(f"engine {self.name} is a server: it loads a folder, not tensors")
        if self.weights_url:
            what = f"{self.base_url} could not fetch {update.folder} from {self.weights_url}"
            await self._call(
                "POST",
                "/mirror_weights",
                what,
                json={"source": self.weights_url, "folder": str(update.folder)},
            )
        return str(update.folder)

    async def load_weights(self, update: WeightUpdate) -> dict[str, Any]:
        """The folder through SGLang's ``reload_path`` (``rstar2 serve`` has it too); a refusal (an
        error status, SGLang's ``"success": false``) is a ``ServerError``."""
        folder = await self.folder_of(update)
        what = f"{self.base_url}{self.reload_path} could not load {folder}"
        body: dict[str, Any] = {"model_path": folder, "weight_version": str(update.version)}
        answer = await self._call("POST", self.reload_path, what, json=body)
        if answer.get("success") is False:
            raise ServerError(f"{what}: {answer.get('message', answer)}")
        return answer

    async def _call(
        self, method: str, path: str, what: str | None = None, *, retries: int = 0, **kw: Any
    ) -> dict[str, Any]:
        """``method`` ``path``; its JSON object answer ({} if none), or a ``ServerError`` that starts
        with ``what``. ``retries`` more tries, backing off, while the server cannot be reached or
        answers 5xx; a kept-alive connection the server closed as the request went out is always
        tried once more (the routes these calls reach can be repeated). A server that took the
        request and gave no answer within the timeout is not asked again: the scheduler moves the
        turn to another engine, rather than wait the timeout out several times on this one."""
        what = what or f"{self.base_url}{path}"
        for attempt in range(retries + 1):
            try:
                try:
                    resp = await self._client.request(method, path, **kw)
                except httpx.RemoteProtocolError:
                    resp = await self._client.request(method, path, **kw)
            except httpx.HTTPError as exc:
                if attempt == retries or isinstance(exc, httpx.ReadTimeout):
                    raise ServerError(f"{what}: {type(exc).__name__}: {exc}") from exc
            else:
                if resp.status_code == 200:
                    break
                said = f"{what}: answered {resp.status_code}: {resp.text[:500]}"
                if resp.status_code < 500:
                    raise RequestRefused(said, status=resp.status_code)
                if attempt == retries:
                    raise ServerError(said, status=resp.status_code)
            await asyncio.sleep(0.5 * 2**attempt)
        try:
            answer = resp.json()
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}

    async def close(self) -> None:
        await self._client.aclose()
