"""`rstar2 serve` against OpenAIEngine (the HTTP engine tested on a real server), and
`rstar2 eval` end to end on the tiny model, resumed after a crash mid-file."""

from __future__ import annotations

import asyncio
import json
import subprocess

import httpx
import pytest
import torch

from rstar2.config import EngineSection
from rstar2.engines.base import SamplingParams
from rstar2.engines.hf import HFEngine
from rstar2.engines.kinds import open_engines
from rstar2.engines.openai import OpenAIEngine, ServerError, capacity_from_vllm_metrics

from ..conftest import ROOT, RSTAR2, serve_model


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    yield from serve_model(
        tiny_dir, "--max-batch-size", "8", "--weights-from", str(tmp_path_factory.getbasetemp())
    )


async def test_openai_engine_on_rstar2_serve_matches_the_local_engine(server, tiny):
    model, tok = tiny
    prompt = tok.encode(
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    params = SamplingParams(max_new_tokens=12, temperature=0)
    remote = OpenAIEngine(server)
    local = HFEngine(model)
    try:
        got, want = await remote.generate(prompt, params), await local.generate(prompt, params)
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        seeded = SamplingParams(max_new_tokens=10, temperature=1.0, seed=7)
        assert (await remote.generate(prompt, seeded)).token_ids == (
            await local.generate(prompt, seeded)
        ).token_ids
        # the server states its KV capacity (SGLang's server-info key) for the kv scheduler
        assert remote.capacity_source == "default"
        assert await remote.probe_capacity() == HFEngine(model, max_batch_size=8).capacity_tokens
        assert remote.capacity_source == "server info"
    finally:
        await remote.close()
        await local.close()


def test_any_openai_client_can_chat_and_bad_requests_get_clear_errors(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0}
    r = httpx.post(server + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    assert httpx.get(server + "/v1/models").json()["data"][0]["id"]
    r = httpx.post(server + "/v1/completions", json={"prompt": [10**9], "max_tokens": 2}, timeout=60)
    assert r.status_code == 400 and "token ids" in r.text
    r = httpx.post(server + "/v1/completions", json={"prompt": "x", "max_tokens": 0}, timeout=60)
    assert r.status_code == 422


def mini_bench(tmp_path, n=3):
    bench = tmp_path / "mini.jsonl"
    bench.write_text(
        "".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(n))
    )
    return bench


@pytest.mark.slow
@pytest.mark.timeout(900)  # a whole CLI process: importing torch alone can take ~50 s on a loaded VM
def test_eval_command_writes_trajectories_summary_and_plots(tiny_dir, tmp_path):
    out = tmp_path / "eval"
    args = ["eval", "--model", str(tiny_dir), "--bench", str(mini_bench(tmp_path)), "--samples", "2",
            "--max-tokens", "24", "--max-turns", "2", "--out", str(out), "--device", "cpu"]  # fmt: skip
    run = subprocess.run(RSTAR2 + args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len((out / "mini" / "trajectories.jsonl").read_text().splitlines()) == 6
    summary = json.loads((out / "summary.json").read_text())["benchmarks"]["mini"]
    assert summary["problems"] == 3 and summary["samples"] == 2 and 0 <= summary["pass@1"] <= 1
    assert "pass@2" in summary and "maj@2" in summary
    assert (out / "summary.md").read_text().count("| mini |") == 1
    assert (out / "mini" / "plots.png").read_bytes()[:4] == b"\x89PNG"
    assert "pass@1" in run.stdout
    assert "eval: 100%" in run.stderr  # its progress bar


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eval_takes_every_rollout_knob_and_says_how_it_scored(tiny_dir, tmp_path):
    """A model without tool use, scored leniently, with banned tokens and settings from a config."""
    import yaml

    config = tmp_path / "rl.yaml"
    config.write_text(yaml.safe_dump({
        "kind": "rl", "model": {"path": str(tiny_dir)}, "data": {"train": "x.jsonl"},
        "rollout": {"max_response_tokens": 20, "top_k": 5, "banned_tokens": ["<|im_start|>"]},
    }))  # fmt: skip
    out = tmp_path / "eval"
    args = ["eval", "--model", str(tiny_dir), "--bench", str(mini_bench(tmp_path)), "--samples", "2",
            "--config", str(config), "--set", "temperature=0.9", "--banned-token", "<|endoftext|>",
            "--no-tools", "--verify-mode", "lenient", "--no-progress", "--out", str(out), "--device", "cpu"]  # fmt: skip
    run = subprocess.run(RSTAR2 + args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "eval:" not in run.stderr  # --no-progress
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["verify_mode"] == "lenient" and "scored in lenient mode" in " ".join(run.stderr.split())
    assert settings["top_k"] == 5 and settings["temperature"] == 0.9 and settings["max_turns"] == 1
    assert settings["banned_tokens"] == ["<|endoftext|>"]  # the option wins over the file
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    banned = tok.convert_tokens_to_ids("<|endoftext|>")
    trajs = [json.loads(x) for x in (out / "mini" / "trajectories.jsonl").read_text().splitlines()]
    prompt = tok.decode(trajs[0]["prompt_ids"])
    assert "<tools>" not in prompt and "system" not in prompt  # the bare problem
    assert all(len(t["turns"]) == 1 and banned not in t["response_ids"] for t in trajs)
    bad = subprocess.run(RSTAR2 + [*args[:-4], "--banned-token", "<nope>", "--out", str(tmp_path / "e2")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert bad.returncode == 2 and "banned_tokens" in bad.stderr and "<nope>" in bad.stderr


async def test_eval_resumes_after_a_crash_mid_file(tiny, chatml, pool, verifier, tmp_path):
    from rstar2.config import RolloutSection
    from rstar2.eval.harness import evaluate
    from rstar2.rollout import Rollout

    engine = HFEngine(tiny[0])
    rollout = Rollout(engine, chatml, pool, verifier, RolloutSection(max_turns=2, max_response_tokens=16))
    bench, out = str(mini_bench(tmp_path)), tmp_path / "eval"
    try:
        await evaluate(rollout, [bench], out, samples=2, progress=False)
        traj_file = out / "mini" / "trajectories.jsonl"
        lines = traj_file.read_text().splitlines()
        # a crash left a half-written line and lost one trajectory: the rerun redoes only those
        kept = lines[:4]
        traj_file.write_text("\n".join(kept) + "\n" + lines[4][: len(lines[4]) // 2])
        served = engine.stats["requests"]
        summary = await evaluate(rollout, [bench], out, samples=2, progress=False)
        again = traj_file.read_text().splitlines()
        assert len(again) == 6 and again[:4] == kept
        done = {(json.loads(x)["meta"]["problem_index"], json.loads(x)["meta"]["sample"]) for x in again}
        assert done == {(p, s) for p in range(3) for s in range(2)}
        assert engine.stats["requests"] - served <= 2 * 2  # two trajectories of at most two turns
        assert summary["mini"]["trajectories"] == 6
    finally:
        await engine.close()


def test_vllm_kv_capacity_is_read_from_its_metrics():
    metrics = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048"} 1.0\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
    )
    assert capacity_from_vllm_metrics(metrics) == 32768
    assert capacity_from_vllm_metrics("vllm:num_requests_running 3\n") is None


async def test_priority_goes_to_rstar2_serve_only_and_its_counters_come_back(server, tiny):
    """vLLM refuses a priority unless started with ``--scheduling-policy priority``: the client
    sends one only to a server that says it is ``rstar2 serve``, which reports its engine's
    counters (the trainer's per-step ``engine/*`` metrics)."""
    remote = OpenAIEngine(server)
    params = SamplingParams(max_new_tokens=4, priority=-7)
    try:
        assert "priority" not in remote.body([1, 2], params, "m")
        await remote.probe_capacity()
        assert remote.send_priority and remote.body([1, 2], params, "m")["priority"] == -7
        before = await remote.counters()
        await remote.generate([5, 6, 7], params)
        after = await remote.counters()
        assert after["requests"] == before["requests"] + 1 and after["rows"] == 8
        assert after["steps"] > before["steps"] and after["row_steps"] >= after["steps"]
    finally:
        await remote.close()


async def test_the_engine_section_sets_how_long_a_server_may_take_to_answer(server):
    """``rollout.engine.server_timeout_s`` reaches every server's client (600 s by default: a turn
    of many thousand tokens on a slow server may need more)."""
    engines = await open_engines(EngineSection(servers=[server], server_timeout_s=1234.5))
    default = await open_engines(EngineSection(servers=[server]))
    try:
        assert engines[0]._client.timeout.read == 1234.5
        assert default[0]._client.timeout.read == 600.0
        assert (await engines[0].generate([5, 6, 7], SamplingParams(max_new_tokens=2))).token_ids
    finally:
        for engine in engines + default:
            await engine.close()


async def test_a_server_that_takes_a_request_and_never_answers_is_asked_once():
    """Connection errors and 5xx answers are retried on the same server; a request the server took
    and never answered (a read timeout) is not: it would only wait the timeout out again, and the
    scheduler moves the turn to another engine."""
    heard: list[bytes] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heard.append(await reader.readuntil(b"\r\n\r\n"))
        await reader.read()  # until the client gives up and closes
        writer.close()

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    engine = OpenAIEngine(f"http://127.0.0.1:{port}", model="m", timeout_s=0.5, retries=3)
    try:
        with pytest.raises(ServerError, match="ReadTimeout"):
            await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4))
        assert len(heard) == 1 and heard[0].startswith(b"POST /v1/completions")
    finally:
        await engine.close()
        listener.close()


def test_rstar2_serve_bans_what_logit_bias_bans_and_refuses_what_it_cannot_honour(server, tiny, tmp_path):
    """``logit_bias`` -100 bans a token (OpenAIEngine sends the rollout's banned tokens so); any
    other bias, an unknown field, or a weight load without its policy version is refused with a
    clear error instead of being dropped; a folder that does not fit the model changes nothing."""
    from safetensors.torch import save_file

    prompt = tiny[1].encode("count: one two three", add_special_tokens=False)
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 0, "return_token_ids": True}
    top = httpx.post(server + "/v1/completions", json=body, timeout=60).json()["choices"][0]["token_ids"][0]
    banned = {**body, "logit_bias": {str(top): -100}}
    got = httpx.post(server + "/v1/completions", json=banned, timeout=60).json()["choices"][0]
    assert got["token_ids"][0] != top
    local = teacher_logprobs(tiny[0], prompt, top, got["token_ids"][0])
    assert got["logprobs"]["token_logprobs"][0] == pytest.approx(local, abs=1e-4)  # renormalised
    r = httpx.post(server + "/v1/completions", json={**body, "logit_bias": {str(top): 5}}, timeout=60)
    assert r.status_code == 400 and "takes only -100" in r.text
    r = httpx.post(server + "/v1/completions", json={**body, "min_p": 0.1}, timeout=60)
    assert r.status_code == 422 and "min_p" in r.text

    before = httpx.get(server + "/get_server_info").json()
    r = httpx.post(server + "/update_weights_from_disk", json={"model_path": str(tmp_path)}, timeout=60)
    assert r.status_code == 400 and "weight_version" in r.text
    name = next(iter(tiny[0].state_dict()))
    save_file({name: torch.zeros(3, 3)}, str(tmp_path / "model.safetensors"))
    load = {"model_path": str(tmp_path), "weight_version": "9"}
    r = httpx.post(server + "/update_weights_from_disk", json=load, timeout=60)
    assert r.status_code == 400 and "nothing was loaded" in r.text
    after = httpx.get(server + "/get_server_info").json()
    assert after["weights_version"] == before["weights_version"] == -1  # none loaded yet
    assert after["weights_fingerprint"] == before["weights_fingerprint"]


def teacher_logprobs(model, prompt: list[int], banned: int, token: int) -> float:
    """log p(token) after ``prompt`` with ``banned`` left out of the distribution."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].float()
    logits[banned] = float("-inf")
    return float(logits.log_softmax(-1)[token])


async def test_a_server_that_returns_no_log_probs_is_an_error_not_a_probability_of_one():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        choice = {"token_ids": [5, 6], "finish_reason": "stop", "logprobs": None}
        return httpx.Response(200, json={"choices": [choice]})

    engine = OpenAIEngine("http://other:8000", name="other")  # a name for logs and faults
    assert (engine.name, OpenAIEngine("http://other:8000/v1").name) == ("other", "http://other:8000")
    engine._client = httpx.AsyncClient(base_url=engine.base_url, transport=httpx.MockTransport(handler))
    with pytest.raises(Exception, match="no log-prob for each sampled token"):
        await engine.generate([1, 2], SamplingParams(max_new_tokens=2))
    await engine.close()


def test_the_openai_clients_streaming_on_rstar2_serve_joins_to_the_whole_answer(server):
    """``stream: true`` on both routes, through OpenAI's own client: a chunk a token, the chunks'
    text the whole answer's, the finish reason and usage last; a request the engine refuses before
    its first token is a 400, not an empty stream."""
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="unused")
    ask = {"model": "tiny", "prompt": "hello there", "max_tokens": 12, "temperature": 0}
    whole = client.completions.create(**ask)
    chunks = list(client.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        whole.choices[0].finish_reason
    ]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert (
        len([c for c in chunks if c.choices]) == whole.usage.completion_tokens + 1
    )  # a token each, then the end

    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 10,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**chat, n=2)
    texts, roles = {0: "", 1: ""}, set()
    for c in client.chat.completions.create(**chat, n=2, stream=True):
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
            roles |= {choice.delta.role} - {None}
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices] and roles == {"assistant"}

    with pytest.raises(BadRequestError):
        client.completions.create(model="tiny", prompt=[5] * 3000, max_tokens=4, stream=True)
    body = {"prompt": [5] * 3000, "max_tokens": 4, "stream": True}
    r = httpx.post(server + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400 and "leaves no room in the model's 2048 positions" in r.text


def test_a_stream_whose_client_goes_away_stops_its_generation(server):
    """A client that closes a stream mid-answer frees the engine: its row leaves at the next step
    (``abandoned``), not after decoding the rest of ``max_tokens`` for nobody."""
    import time

    before = httpx.get(server + "/health").json()["engine"]
    body = {"prompt": "hello there", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server + "/v1/completions", json=body, timeout=60) as r:
        events = (line for line in r.iter_lines() if line.startswith("data: "))
        assert all(next(events) != "data: [DONE]" for _ in range(3))  # tokens arrive; the client goes
    deadline = time.monotonic() + 60
    while (now := httpx.get(server + "/health").json())["in_flight"] or now["engine"]["abandoned"] == before[
        "abandoned"
    ]:
        assert time.monotonic() < deadline, now
        time.sleep(0.05)
    assert now["engine"]["abandoned"] == before["abandoned"] + 1
    assert now["engine"]["row_steps"] - before["row_steps"] < 1000  # not 1,500 decoded for nobody


async def test_a_whole_answers_client_that_goes_away_stops_its_generation_too(server, tiny):
    """A client waiting for a whole answer (not streamed, as ``OpenAIEngine``) that goes away frees
    the engine as a stream's does: closed connections and a client's own timeout
    (``server_timeout_s``) take their rows out of the batch (``running``, ``abandoned``) instead of
    decoding the rest of ``max_tokens`` for nobody, and the server answers the next request."""
    from rstar2.chat.format import end_of_turn_ids

    async def health(client: httpx.AsyncClient) -> dict:
        return (await client.get(server + "/health")).json()

    async def until(client: httpx.AsyncClient, done) -> dict:
        deadline = asyncio.get_running_loop().time() + 120  # a hang's guard, not a speed asked
        while not done(now := await health(client)):
            assert asyncio.get_running_loop().time() < deadline, now
            await asyncio.sleep(0.05)
        return now

    budget = 2000
    completion = {"prompt": "hello there", "max_tokens": budget, "ignore_eos": True}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": budget, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=60) as watch:
        before = (await health(watch))["engine"]
        async with httpx.AsyncClient(timeout=60) as caller:  # 3 completions and a chat, then closed
            asked = [caller.post(server + "/v1/completions", json=completion) for _ in range(3)]
            asked.append(caller.post(server + "/v1/chat/completions", json=chat))
            waiting = [asyncio.ensure_future(a) for a in asked]
            await until(watch, lambda h: h["running"] == 4)  # all four rows decoding
            for w in waiting:
                w.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
        now = await until(watch, lambda h: h["engine"]["abandoned"] == before["abandoned"] + 4)
        now = await until(watch, lambda h: h["running"] == 0 and h["in_flight"] == 0)
        assert now["engine"]["abandoned"] == before["abandoned"] + 4  # none finished: each left
        assert now["engine"]["generated_tokens"] == before["generated_tokens"]  # none answered
        assert now["engine"]["row_steps"] - before["row_steps"] < 4 * budget

        # the trainer's client, its timeout fired: its request leaves too (never finished)
        stops = tuple(end_of_turn_ids(tiny[1]))
        engine = OpenAIEngine(server, timeout_s=1.0, retries=0)
        try:
            with pytest.raises(ServerError, match="ReadTimeout"):
                await engine.generate(
                    [5, 6, 7], SamplingParams(max_new_tokens=budget, banned_token_ids=stops)
                )
        finally:
            await engine.close()
        now = await until(watch, lambda h: h["engine"]["abandoned"] == before["abandoned"] + 5)
        now = await until(watch, lambda h: h["running"] == 0 and h["in_flight"] == 0)
        assert now["engine"]["generated_tokens"] == before["generated_tokens"]

        # and it serves on
        answer = await watch.post(server + "/v1/completions", json={**completion, "max_tokens": 4})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4


def test_streamed_text_keeps_back_a_tool_calls_opening_and_waits_for_whole_characters():
    from rstar2.engines.streaming import TextDeltas

    pieces = {1: "Let me ", 2: "run <to", 3: "ol_call>{", 4: "\ufffd", 5: "é"}

    def decode(ids):  # a token that ends inside a character decodes to U+FFFD until the next one
        text = "".join(pieces[i] for i in ids)
        return text.replace("\ufffdé", "é")

    plain = TextDeltas(decode)
    assert [plain.add(i) for i in (1, 2)] == ["Let me ", "run <to"]
    held = TextDeltas(decode, hold="<tool_call>")
    assert [held.add(i) for i in (1, 2, 3)] == ["Let me ", "run ", ""]  # never a piece of the tag
    assert held.rest(decode([1, 2, 3])) == "<tool_call>{"
    chars = TextDeltas(decode)
    assert [chars.add(i) for i in (1, 4, 5)] == ["Let me ", "", "é"]
    pieces.update({6: "a line\n", 7: "next"})
    lines = TextDeltas(decode)  # after a line break only the tokens since are decoded again
    assert [lines.add(i) for i in (6, 1, 7)] == ["a line\n", "Let me ", "next"] and lines.ids == [1, 7]
    assert lines.rest("a line\nLet me next!") == "!" and lines.rest("a line\nLet us") == "us"
