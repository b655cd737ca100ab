"""``VLLMEngine``: a vLLM server started by ``rstar2 vllm``, through vLLM's RL routes:
``/inference/v1/generate`` says which weights sampled each token, and new weights load in place
with requests in flight kept. ``/server_info`` says what the server is; a vLLM without its
development routes is an ``OpenAIEngine``. vLLM on a CPU can die under many concurrent seeded
prefills (``CPU Generator does not use offset``, then every request fails until a restart): there
requests go unseeded."""

from __future__ import annotations

import sys
from contextlib import suppress
from typing import Any

import httpx

from ..adapters import is_adapter
from ..auth import client_headers
from .base import Generation, SamplingParams, WeightUpdate
from .openai import OpenAIEngine, RequestRefused, ServerError, get_object, stated_number

GENERATE = "/inference/v1/generate"
ADAPTER_PREFIX = "rstar2-v"  # the names of the adapters rstar2 loads: rstar2-vVERSION-RANDOM
HOW_TO_START = (
    "start it with `rstar2 vllm` (VLLM_SERVER_DEV_MODE=1, --enable-scale-out, rstar2's worker extension)"
)


async def vllm_config(client: httpx.AsyncClient) -> dict[str, Any] | None:
    """The server's vLLM configuration, or None when it is no vLLM in development mode."""
    return await get_object(
        client, "/server_info", "vllm_config", params={"config_format": "json"}, timeout=10
    )


def token_versions(spans: Any, n: int) -> list[int] | None:
    """vLLM's ``weight_versions`` spans (``{"version", "start", "end"}`` over the output tokens) as
    one policy version a token; -1 where the version is not one rstar2 set (vLLM's ``default``)."""
    if not isinstance(spans, list):
        return None
    versions = [-1] * n
    for span in spans:
        version = stated_number(span.get("version"))
        for i in range(max(0, int(span["start"])), min(n, int(span["end"]))):
            versions[i] = -1 if version is None else version
    return versions


_WARNED_UNSEEDED: set[str] = set()  # servers already warned about going unseeded (once a process)


class VLLMEngine(OpenAIEngine):
    """With an adapter (``model.lora``) each update loads the adapter under a name of its own that
    requests then name (vLLM keeps a request on its adapter to the end, and no prefix cached under
    one adapter serves another); a token's version is its base's (held by ``rstar2_load``) made the
    version of the adapter the answer says it came from."""

    path = GENERATE

    @classmethod
    async def serves(cls, url: str) -> bool:
        """Whether the server at ``url`` is a vLLM in development mode (as ``rstar2 vllm`` starts it)."""
        async with httpx.AsyncClient(
            base_url=url.rstrip("/").removesuffix("/v1"), headers=client_headers()
        ) as client:
            return await vllm_config(client) is not None

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.adapters: dict[str, int] = {}  # adapter name → policy version, the newest adapter_slots loaded
        self.adapter_slots: int | None = None  # adapters the server holds at once (0: it serves none)

    async def probe_capacity(self) -> int:
        """Its KV capacity (blocks × block size, unless the config set one), and whether it samples
        seeded requests safely (not on a CPU) and orders by priority."""
        config = await vllm_config(self._client)
        if config is None:
            raise ServerError(f"{self.base_url} answers no /server_info: {HOW_TO_START}")
        parallel = config.get("parallel_config") or {}
        workers = int(parallel.get("tensor_parallel_size") or 1) * int(
            parallel.get("pipeline_parallel_size") or 1
        )
        if workers > 1:  # each worker would answer for its shard: counts and zero checks per shard, untested
            raise ServerError(
                f"{self.base_url} runs {workers} workers (tensor or pipeline parallel): rstar2's checked "
                "in-place weight load is made for one; serve one model per GPU and list each server"
            )
        self.version_source = "tokens"  # each token's weight version, in spans
        cache = config.get("cache_config") or {}
        if self.capacity_source == "default" and cache.get("num_gpu_blocks"):
            self.capacity_tokens = int(cache["num_gpu_blocks"]) * int(cache["block_size"])
            self.capacity_source = "server info"
        # its adapter slots: vLLM keeps max_cpu_loras adapters (max_loras of them in one batch) and
        # reads an adapter pushed out again from its folder when a request names it
        lora = config.get("lora_config") or {}
        self.adapter_slots = min(int(lora.get("max_loras") or 0), int(lora.get("max_cpu_loras") or 1 << 30))
        self.send_priority = (config.get("scheduler_config") or {}).get("policy") == "priority"
        self.send_seed = (config.get("device_config") or {}).get("device") != "cpu"
        if not self.send_seed and self.base_url not in _WARNED_UNSEEDED:
            _WARNED_UNSEEDED.add(self.base_url)
            print(
                f"[rstar2] {self.name}: vLLM on a CPU dies under concurrent seeded requests; "
                "requests to it go unseeded (rollouts are not reproducible from the seed)",
                file=sys.stderr,
            )
        return self.capacity_tokens

    def body(self, prompt_ids: list[int], params: SamplingParams, model: str) -> dict[str, Any]:
        # the log-prob is of the distribution sampled (--logprobs-mode); only the rollout's stop
        # tokens end a turn, as on every engine
        sampling = {**self.sampling(params), "ignore_eos": True}
        model = next(reversed(self.adapters)) if self.adapters else model  # the newest adapter
        body: dict[str, Any] = {"model": model, "token_ids": list(prompt_ids), "sampling_params": sampling}
        if self.send_priority and params.priority:
            body["priority"] = params.priority
        return body

    def parse(self, choice: dict[str, Any]) -> Generation:
        ids = [int(t) for t in choice.get("token_ids") or []]
        content = (choice.get("logprobs") or {}).get("content") or []
        if len(content) != len(ids):
            raise ServerError(f"{self.base_url} returned {len(content)} log-probs for {len(ids)} tokens")
        if choice.get("finish_reason") not in ("stop", "length"):
            raise ServerError(f"{self.base_url} ended a request with {choice.get('finish_reason')!r}")
        finish = "length" if choice["finish_reason"] == "length" else "stop"
        versions = token_versions(choice.get("weight_versions"), len(ids))
        return Generation(ids, [float(c["logprob"]) for c in content], finish, versions)  # type: ignore[arg-type]

    def parse_answer(self, answer: dict[str, Any]) -> Generation:
        gen = self.parse(answer["choices"][0])
        if self.adapters and gen.versions is not None:  # the adapter the server says sampled them
            version = self.adapters.get(str(answer.get("model")), -1)
            gen.versions = [-1 if v < 0 else version for v in gen.versions]
        return gen

    async def load_adapter(self, folder: str, version: int) -> dict[str, Any]:
        """The adapter in ``folder`` as policy ``version``, under a name never used before (a name
        loaded again would let vLLM serve prefixes cached under the old adapter: vLLM #42125); the
        oldest beyond the server's ``adapter_slots`` unloaded, and at this engine's first load those
        of earlier runs."""
        import secrets

        from .vllm_launch import LORA_SLOTS

        slots = self.adapter_slots or LORA_SLOTS  # not probed (a test's engine): rstar2 vllm's default
        what = f"{self.base_url} could not load the adapter in {folder}"
        if not self.adapters:  # this engine's first: the adapters earlier runs left go
            listed = (await self._call("GET", "/v1/models", what)).get("data") or []
            for model in listed:
                if str(model.get("id")).startswith(ADAPTER_PREFIX):
                    await self._unload(model["id"], what)
        name = f"{ADAPTER_PREFIX}{version}-{secrets.token_hex(4)}"
        await self._call("POST", "/v1/load_lora_adapter", what, json={"lora_name": name, "lora_path": folder})
        self.adapters[name] = version
        for old in list(self.adapters)[:-slots]:
            del self.adapters[old]
            await self._unload(old, what)
        return {"adapter": name}

    async def _unload(self, name: str, what: str) -> None:
        with suppress(RequestRefused):  # a server restarted since holds none of the old ones
            await self._call("POST", "/v1/unload_lora_adapter", what, json={"lora_name": name})

    async def load_weights(self, update: WeightUpdate) -> dict[str, Any]:
        """Load the folder in place as policy ``update.version`` (``reload_path``, SGLang's route,
        goes unused); a load that left a parameter unwritten, or any refused step, is a
        ``ServerError``. The server resumes only after a whole load: after a failed one it stays
        paused (its weights may be half written; requests wait) until a later load succeeds, or the
        run stops."""
        model_dir, version = await self.folder_of(update), update.version
        if is_adapter(model_dir):
            return await self.load_adapter(model_dir, version)
        what = f"{self.base_url} could not load {model_dir}"
        await self._call("POST", "/pause", what, params={"mode": "keep"})
        # no number until the load is whole: a token decoded meanwhile (a caller resumed it) is never trained on
        await self._call("POST", "/update_weight_version", what, json={"new_version": "loading"})
        load = {"method": "rstar2_load", "kwargs": {"folder": model_dir}}
        answers = (await self._call("POST", "/collective_rpc", what, json=load)).get("results")
        if not answers or not all(isinstance(a, dict) for a in answers):
            raise ServerError(f"{what}: no worker answered rstar2_load ({answers}); {HOW_TO_START}")
        for a in answers:  # a parameter may stay zero only where the folder holds zeros
            if a.get("error"):  # with a status: refused before anything was written
                refused = RequestRefused if a.get("status") else ServerError
                raise refused(f"{what}: {a['error']}", status=a.get("status"))
            if a["missing"] or len(a["unwritten"]) > a["zero_in_folder"]:
                raise ServerError(
                    f"{what}: parameters not loaded {a['missing'][:4]} ({len(a['missing'])}), "
                    f"still zero {a['unwritten'][:4]} ({len(a['unwritten'])}; the folder has "
                    f"{a['zero_in_folder']} all-zero tensors)"
                )
        await self._call("POST", "/update_weight_version", what, json={"new_version": str(version)})
        # running requests prefill again under the new weights; cached prefixes are dropped
        reset = await self._call(
            "POST", "/reset_prefix_cache", what, params={"reset_running_requests": "true"}
        )
        if reset.get("success") is not True:
            raise ServerError(f"{what}: its prefix cache could not be reset ({reset})")
        await self._call("POST", "/resume", f"{self.base_url} could not resume")
        stated = str((await self._call("GET", "/weight_info", what)).get("weight_version"))
        written = sum(a["parameters"] for a in answers)
        return {"weights_version": int(stated) if stated.isdigit() else stated, "parameters_written": written}
