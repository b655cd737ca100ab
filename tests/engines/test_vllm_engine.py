"""``VLLMEngine``'s requests and answers, by hand (a real vLLM runs in tests/test_vllm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rstar2.engines.base import SamplingParams, WeightUpdate
from rstar2.engines.openai import ServerError
from rstar2.engines.vllm import VLLMEngine, token_versions


def test_weight_version_spans_become_one_version_a_token():
    spans = [{"version": "default", "start": 0, "end": 2}, {"version": "3", "start": 2, "end": 5}]
    assert token_versions(spans, 5) == [-1, -1, 3, 3, 3]
    assert token_versions([{"version": "4", "start": 0, "end": 9}], 3) == [4, 4, 4]  # clipped
    assert token_versions(None, 3) is None


def test_a_request_carries_what_the_rollout_asks_and_a_cpu_server_gets_no_seed():
    engine = VLLMEngine("http://vllm:8000")
    params = SamplingParams(max_new_tokens=5, temperature=0.7, stop_token_ids=(2,), seed=11)
    params.banned_token_ids, params.priority = (7, 9), -3
    body = engine.body([1, 2, 3], params, "m")
    sampling = body["sampling_params"]
    assert body["token_ids"] == [1, 2, 3] and sampling["seed"] == 11 and "priority" not in body
    assert sampling["logit_bias"] == {"7": -100, "9": -100} and sampling["stop_token_ids"] == [2]
    assert sampling["ignore_eos"] is True and sampling["top_k"] == -1 and sampling["logprobs"] == 0
    engine.send_seed, engine.send_priority = False, True
    body = engine.body([1], params, "m")
    assert "seed" not in body["sampling_params"] and body["priority"] == -3


def test_an_answer_without_a_log_prob_a_token_or_that_was_aborted_is_an_error():
    engine = VLLMEngine("http://vllm:8000")
    good = {
        "token_ids": [4, 5],
        "finish_reason": "length",
        "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}]},
        "weight_versions": [{"version": "1", "start": 0, "end": 2}],
    }
    gen = engine.parse(good)
    assert gen.token_ids == [4, 5] and gen.logprobs == [-1.0, -2.0] and gen.versions == [1, 1]
    with pytest.raises(ServerError, match="1 log-probs for 2 tokens"):
        engine.parse({**good, "logprobs": {"content": [{"logprob": -1.0}]}})
    with pytest.raises(ServerError, match="abort"):
        engine.parse({**good, "finish_reason": "abort"})


def vllm_answering(config: dict, routes: dict | None = None) -> tuple[VLLMEngine, list[str]]:
    """A ``VLLMEngine`` over a stand-in server: ``/server_info`` answers ``config``, ``routes`` the
    rest (path -> JSON); the paths asked, in order."""
    import httpx

    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/server_info":
            return httpx.Response(200, json={"vllm_config": config})
        if request.url.path in (routes or {}):
            return httpx.Response(200, json=routes[request.url.path])
        return httpx.Response(404, json={})

    engine = VLLMEngine("http://vllm:8000")
    engine._client = httpx.AsyncClient(base_url=engine.base_url, transport=httpx.MockTransport(handler))
    return engine, asked


async def test_more_than_one_worker_is_refused_at_connect():
    """rstar2's checked in-place load counts one worker's parameters and zeros: under tensor or
    pipeline parallelism each worker holds a shard, so such a server is refused, saying why."""
    for parallel in ({"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}):
        engine, _ = vllm_answering({"parallel_config": parallel, "device_config": {"device": "cuda"}})
        with pytest.raises(ServerError, match="runs 2 workers"):
            await engine.probe_capacity()
        await engine.close()
    engine, _ = vllm_answering(
        {"parallel_config": {"tensor_parallel_size": 1}, "device_config": {"device": "cuda"}}
    )
    await engine.probe_capacity()
    assert engine.send_seed and engine.version_source == "tokens"  # seeds go to a GPU server
    await engine.close()


async def test_a_failed_load_leaves_the_server_paused_under_no_version():
    """Paused first, relabelled "loading" (no number: nothing it decodes meanwhile trains), then
    loaded; a worker that says a parameter was left out ends it there: no new version, no resume."""
    half = {
        "missing": ["model.layers.0.mlp.down_proj.weight"],
        "unwritten": [],
        "zero_in_folder": 0,
        "parameters": 9,
    }
    routes = {"/pause": {}, "/update_weight_version": {}, "/collective_rpc": {"results": [half]}}
    engine, asked = vllm_answering({}, routes)
    with pytest.raises(ServerError, match="parameters not loaded"):
        await engine.load_weights(WeightUpdate(4, folder=Path("/runs/r/weights-latest")))
    assert asked == ["/pause", "/update_weight_version", "/collective_rpc"]
    whole = {"missing": [], "unwritten": [], "zero_in_folder": 0, "parameters": 9}
    routes |= {"/collective_rpc": {"results": [whole]}, "/reset_prefix_cache": {"success": True}}
    routes |= {"/resume": {}, "/weight_info": {"weight_version": "4"}}
    engine, asked = vllm_answering({}, routes)
    assert await engine.load_weights(WeightUpdate(4, folder=Path("/runs/r/weights-latest"))) == {
        "weights_version": 4,
        "parameters_written": 9,
    }
    assert asked[-3:] == ["/reset_prefix_cache", "/resume", "/weight_info"]
    await engine.close()


def test_a_recipes_vllm_on_a_gpu_takes_a_memory_share_and_the_models_dtype(tmp_path):
    from rstar2.engines.vllm_launch import local_command

    gpu = local_command(tmp_path, 8000, gpu=True, weights_from=[tmp_path])
    assert gpu[gpu.index("--dtype") + 1] == "auto"
    assert gpu[gpu.index("--") :] == ["--", "--gpu-memory-utilization", "0.4"]
    cpu = local_command(tmp_path, 8000, gpu=False, weights_from=[tmp_path], cores="1")
    assert cpu[cpu.index("--dtype") + 1] == "float32" and "--gpu-memory-utilization" not in cpu
    assert cpu[cpu.index("--weights-from") + 1] == str(tmp_path)
    shared = local_command(
        tmp_path, 8000, gpu=True, weights_from=[tmp_path], gpu_share=0.25, dtype="bfloat16"
    )
    assert shared[shared.index("--dtype") + 1] == "bfloat16" and shared[-1] == "0.25"


async def test_the_adapter_slots_are_the_servers_and_bound_max_staleness():
    """The client keeps as many adapter names as the server holds (``rstar2 vllm --lora-slots``:
    vLLM's max_loras and max_cpu_loras), not a constant; a run whose max_staleness k needs more
    (k + 1: a request decodes under the adapter that was newest as it started, while up to k newer
    load) is refused at its start, as is a server started without --lora-rank."""
    from rstar2.rl.algorithm.staleness import StalenessError
    from rstar2.rl.run.engine_mode import require_adapter_slots

    config = {"device_config": {"device": "cpu"}, "lora_config": {"max_loras": 2, "max_cpu_loras": 2}}
    routes = {"/v1/models": {"data": []}, "/v1/load_lora_adapter": {}, "/v1/unload_lora_adapter": {}}
    engine, asked = vllm_answering(config, routes)
    await engine.probe_capacity()
    assert engine.adapter_slots == 2
    for version in range(1, 6):
        await engine.load_adapter("/runs/r/weights-latest", version)
    assert list(engine.adapters.values()) == [4, 5] and asked.count("/v1/unload_lora_adapter") == 3
    require_adapter_slots([engine], 1)
    with pytest.raises(StalenessError, match="holds 2 adapters at once.*--lora-slots 3"):
        require_adapter_slots([engine], 2)
    await engine.close()
    engine, _ = vllm_answering({"device_config": {"device": "cpu"}, "lora_config": None})
    await engine.probe_capacity()
    with pytest.raises(StalenessError, match="started without --lora-rank"):
        require_adapter_slots([engine], 0)
    await engine.close()
