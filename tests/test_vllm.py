"""rstar2 on a real vLLM server (``rstar2 vllm``, vLLM from scripts/setup-vllm.sh): sampling that
agrees with the trainer, weights loaded in place and checked, per-token versions, seeds that never
take it down, and the CLI's roads whole (``eval --server``, ``train`` at k = 0 and k = 1, a
recipe that starts its own). One server for the module's other tests, on the miniature recipe's
starting model (a tiny Qwen2 with heads of 32, what vLLM's CPU attention computes)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest
import torch
import yaml

from rstar2.auth import KEY_ENV
from rstar2.engines.base import SamplingParams, WeightUpdate
from rstar2.engines.kinds import connect
from rstar2.engines.openai import ServerError
from rstar2.engines.vllm_launch import installed, vllm_python
from rstar2.recipe.tiny_model import build_model, build_tokenizer, save_pretrained
from rstar2.rl.run.metrics_log import read_metrics

from .conftest import CORPUS, ROOT, RSTAR2, free_port, stop, wait_http
from .rl.test_async import assert_versions_in_bound
from .rl.test_scale_out import cli, ok, small_rl, write_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
TOL = 1e-4  # nats: vLLM's log-prob of a sampled token against the trainer's, both in fp32
KEY = "vllm-test-key"


def need_vllm() -> None:
    """vLLM must be there: the README's test command installs it (scripts/setup-vllm.sh)."""
    if not installed():
        pytest.fail(f"vLLM is not installed for {vllm_python()}; run scripts/setup-vllm.sh")


def recipe_tree() -> dict:
    """The miniature recipe (sft, rl-64) with heads of 32: what vLLM's CPU attention computes."""
    from .recipe.test_recipe import miniature

    tree = miniature()
    tree["model"].update(hidden=64, heads=2, max_positions=2048)  # the eval prompt: ~1000 tokens
    tree["stages"] = tree["stages"][:2]
    tree["eval"]["entropy_trajectories"] = 0
    return tree


@pytest.fixture(scope="module")
def recipe_out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-recipe")


@pytest.fixture(scope="module")
def model_dir(recipe_out) -> Path:
    """The recipe's starting model: the one model the module's server serves (a load keeps its
    sizes), which every test here loads, trains or samples."""
    from rstar2.recipe.run import prepare_model
    from rstar2.recipe.spec import parse_recipe

    return prepare_model(parse_recipe(recipe_tree()), recipe_out)


@pytest.fixture(scope="module")
def api_key():
    """The module's servers ask for a key; rstar2's clients here (and the CLI runs) send it from
    ``$RSTAR2_API_KEY``."""
    before = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = KEY
    yield KEY
    if before is None:
        del os.environ[KEY_ENV]
    else:
        os.environ[KEY_ENV] = before


AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def weights_service(tmp_path_factory, api_key):
    """A weight service over the session's folders (``rstar2.weight_transfer``), the one the module's
    vLLM may fetch from (``--fetch-from``): the road without a shared filesystem."""
    port = free_port()
    serve = [
        "-m",
        "rstar2.weight_transfer",
        "--root",
        str(tmp_path_factory.getbasetemp()),
        "--port",
        str(port),
    ]
    proc = subprocess.Popen([RSTAR2[0], *serve], cwd=ROOT, stderr=subprocess.PIPE)
    wait_http(f"http://127.0.0.1:{port}", proc)
    yield f"http://127.0.0.1:{port}"
    stop(proc)


@pytest.fixture(scope="module")
def vllm(model_dir, tmp_path_factory, api_key, weights_service):
    """``rstar2 vllm`` on the tiny model, started as a user would, with an API key and the tests'
    folders to load weights from, serving adapters up to rank 8 beside the whole model (one server
    for every test: whole-model requests on a LoRA-enabled vLLM are checked by the tests that make
    them); its log beside the test's files."""
    need_vllm()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("vllm-log") / "server.log"
    args = ["vllm", "--model", str(model_dir), "--port", str(port), "--dtype", "float32", "--eager"]
    args += ["--lora-rank", "8"]
    args += [
        "--kv-cache-gib",
        "1",
        "--api-key",
        api_key,
        "--weights-from",
        str(tmp_path_factory.getbasetemp()),
        "--fetch-from",
        weights_service,
    ]
    args += ["--", "--root-path", "/api"]  # behind a proxy's prefix: the guard sees routes without it
    with log.open("wb") as fh:
        proc = subprocess.Popen(RSTAR2 + args, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_http(url, proc, timeout=600)
    except RuntimeError as exc:
        stop(proc)
        raise RuntimeError(f"{exc}\n{log.read_text()[-3000:]}") from None
    yield url
    stop(proc)


def trainer_logprobs(
    folder: Path, prompt: list[int], ids: list[int], temperature: float, banned=()
) -> torch.Tensor:
    """The trainer's teacher-forced log-probs of ``ids`` after ``prompt`` (``rl/algorithm/grpo.py``)."""
    from transformers import AutoModelForCausalLM

    from rstar2.rl.algorithm.grpo import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[:, len(prompt) - 1 : -1]
    ban = torch.tensor(list(banned), dtype=torch.long) if banned else None
    return token_logprobs(logits, torch.tensor([ids]), temperature=temperature, banned=ban)[0][0]


def perturbed(folder: Path, out: Path, scale: float, seed: int) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    model.save_pretrained(out)
    return out


def test_vllm_samples_from_the_distribution_the_trainer_computes(vllm, model_dir):
    """Temperature, banned tokens: vLLM's log-prob of every sampled token is the trainer's."""
    banned = (7, 8, 9, 100)

    async def main():
        engine = await connect(vllm)
        try:
            assert type(engine).__name__ == "VLLMEngine" and engine.capacity_source == "server info"
            params = SamplingParams(max_new_tokens=24, temperature=0.7, banned_token_ids=banned)
            return [await engine.generate(list(range(5, 5 + n)), params) for n in (3, 40)]
        finally:
            await engine.close()

    for n, gen in zip((3, 40), asyncio.run(main()), strict=True):
        assert len(gen.token_ids) == 24 and not set(gen.token_ids) & set(banned)
        mine = trainer_logprobs(model_dir, list(range(5, 5 + n)), gen.token_ids, 0.7, banned)
        assert float((torch.tensor(gen.logprobs) - mine).abs().max()) < TOL


def generated_tokens(url: str) -> float:
    """vLLM's count of tokens generated so far (its Prometheus counter)."""
    found = re.search(
        r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", httpx.get(url + "/metrics", headers=AUTH).text, re.M
    )
    return float(found.group(1)) if found else 0.0


def test_new_weights_reach_vllm_in_place_mid_request_and_each_token_says_its_version(
    vllm, model_dir, tmp_path
):
    """A load while a 400-token request decodes (after its first 20 tokens, counted by the server):
    the request goes on, its tokens before the load are the old weights' and after it the new
    weights' (log-probs of the request itself, against the trainer's on each side)."""
    new = perturbed(model_dir, tmp_path / "new", 0.05, seed=1)
    prompt = [5, 6, 7, 8]

    async def main():
        engine = await connect(vllm)
        try:
            await engine.load_weights(WeightUpdate(1, folder=model_dir))
            start = generated_tokens(vllm)
            long = asyncio.create_task(
                engine.generate(prompt, SamplingParams(max_new_tokens=400, temperature=1.0))
            )
            while generated_tokens(vllm) < start + 20:  # decoding: the load falls after its 20th token
                assert not long.done()
                await asyncio.sleep(0.02)
            answer = await engine.load_weights(WeightUpdate(2, folder=new))
            return answer, await long
        finally:
            await engine.close()

    answer, gen = asyncio.run(main())
    assert answer["weights_version"] == 2 and answer["parameters_written"] > 0
    assert httpx.get(vllm + "/weight_info", headers=AUTH).json() == {"weight_version": "2"}
    v = gen.versions
    assert len(v) == len(gen.token_ids) == 400 and v[:20] == [1] * 20 and v[-1] == 2, (v[:3], v[-3:])
    assert v == sorted(v) and set(v) == {1, 2}  # neither lost nor restarted: 1s, then 2s
    switch = v.index(2)
    old = trainer_logprobs(model_dir, prompt, gen.token_ids, 1.0)
    now = trainer_logprobs(new, prompt, gen.token_ids, 1.0)  # every layer new, the whole context again
    got = torch.tensor(gen.logprobs)
    assert float((got[:switch] - old[:switch]).abs().max()) < TOL
    assert float((got[switch:] - now[switch:]).abs().max()) < TOL
    assert float((got[switch:] - old[switch:]).abs().max()) > 100 * TOL  # and the two do differ


def test_a_refused_load_serves_nothing_until_a_whole_load_succeeds(vllm, model_dir, tmp_path):
    """A load of other sizes, or with a tensor left out, is refused; the server then stays paused (its
    weights may be half written): a request sent meanwhile waits, and is answered by the next whole
    load's weights, under its version."""
    from safetensors.torch import load_file, save_file

    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text((model_dir / "config.json").read_text())
    tensors = load_file(str(model_dir / "model.safetensors"))
    dropped = next(k for k in tensors if "mlp.down_proj" in k)  # a layer vLLM keeps packed on a CPU
    del tensors[dropped]
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})

    other = tmp_path / "other-sizes"
    tok = build_tokenizer(CORPUS, 512)
    save_pretrained(build_model(tok, hidden=32, layers=1, heads=1, mlp=64, max_positions=256), tok, other)

    async def main():
        engine = await connect(vllm)
        try:
            with pytest.raises(ServerError, match="other sizes"):
                await engine.load_weights(WeightUpdate(6, folder=other))
            with pytest.raises(ServerError, match="not loaded") as refused:
                await engine.load_weights(WeightUpdate(7, folder=partial))
            waiting = asyncio.create_task(engine.generate([5, 6], SamplingParams(max_new_tokens=4)))
            await asyncio.sleep(3)  # 4 tokens take milliseconds on a serving vLLM
            assert not waiting.done(), "a request was served from half-loaded weights"
            await engine.load_weights(WeightUpdate(8, folder=model_dir))
            return refused.value, await waiting
        finally:
            await engine.close()

    refused, gen = asyncio.run(main())
    assert "down_proj" in str(refused)
    assert gen.versions == [8] * 4
    mine = trainer_logprobs(model_dir, [5, 6], gen.token_ids, 1.0)
    assert float((torch.tensor(gen.logprobs) - mine).abs().max()) < TOL


def test_vllm_refuses_a_stranger_and_a_folder_outside_its_own(vllm, model_dir, tmp_path_factory):
    """Without the key, vLLM's development routes (load any folder, relabel the version) answer 401;
    with it, ``rstar2_load`` still reads only under ``--weights-from``."""
    load = {"method": "rstar2_load", "kwargs": {"folder": str(model_dir)}}
    assert httpx.post(vllm + "/collective_rpc", json=load, timeout=60).status_code == 401
    assert httpx.post(vllm + "/update_weight_version", json={"new_version": "99"}).status_code == 401
    assert httpx.post(vllm + "/pause").status_code == 401
    assert httpx.get(vllm + "/weight_info").status_code == 401
    assert httpx.get(vllm + "/health").status_code == 200
    theirs = {"method": "reload_weights", "kwargs": {"weights_path": "/etc"}}  # vLLM's own: any path
    assert httpx.post(vllm + "/collective_rpc", json=theirs, headers=AUTH, timeout=60).status_code == 403
    outside = {"method": "rstar2_load", "kwargs": {"folder": "/etc"}}
    answer = httpx.post(vllm + "/collective_rpc", json=outside, headers=AUTH, timeout=60).json()
    assert "not under a folder this server loads weights from" in answer["results"][0]["error"]
    assert httpx.get(vllm + "/weight_info", headers=AUTH).json()["weight_version"] != "99"
    # a folder under --weights-from whose tensors are a link to a file outside it: refused unread
    outside = Path(tempfile.mkdtemp(prefix="rstar2-outside-"))  # not under the tests' folder
    (outside / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes())
    linked = tmp_path_factory.mktemp("vllm-linked")
    for f in model_dir.iterdir():
        if f.name != "model.safetensors":
            (linked / f.name).write_bytes(f.read_bytes())
    (linked / "model.safetensors").symlink_to(outside / "model.safetensors")
    load = {"method": "rstar2_load", "kwargs": {"folder": str(linked)}}
    answer = httpx.post(vllm + "/collective_rpc", json=load, headers=AUTH, timeout=60).json()
    assert "model.safetensors links to a file that is not under" in answer["results"][0]["error"], answer
    adapter = {"lora_name": "x", "lora_path": str(linked)}
    r = httpx.post(vllm + "/v1/load_lora_adapter", json=adapter, headers=AUTH, timeout=60)
    assert r.status_code == 403 and "links to a file that is not under" in r.text
    # a hard link to that file: no path says it lies outside, so a file with other links is refused
    # (with the status the trainer does not retry); load_inplace would relabel a loaded adapter
    (linked / "model.safetensors").unlink()
    os.link(outside / "model.safetensors", linked / "model.safetensors")
    answer = httpx.post(vllm + "/collective_rpc", json=load, headers=AUTH, timeout=60).json()
    assert "other hard links" in answer["results"][0]["error"] and answer["results"][0]["status"] == 403
    inplace = {"lora_name": "x", "lora_path": str(model_dir), "load_inplace": True}
    r = httpx.post(vllm + "/v1/load_lora_adapter", json=inplace, headers=AUTH, timeout=60)
    assert r.status_code == 403 and "load_inplace is refused" in r.text
    # under --root-path /api the route is asked for with its prefix: refused all the same
    assert httpx.post(vllm + "/api/collective_rpc", json=theirs, headers=AUTH, timeout=60).status_code == 403
    # vLLM's routes that change or free the weights outside rstar2's versioned loads, key or not
    for path in ("/sleep", "/weight_checker", "/wake_up", "/api/sleep"):
        r = httpx.post(vllm + path, params={"level": "2"}, json={}, headers=AUTH, timeout=60)
        assert r.status_code == 403 and "--open-route" in r.text, (path, r.status_code, r.text)
    assert httpx.get(vllm + "/is_sleeping", headers=AUTH).json()["is_sleeping"] is False


def test_seeded_requests_never_take_vllm_on_a_cpu_down(vllm):
    """64 concurrent seeded requests of 80-token prompts kill vLLM's CPU engine when the seeds are
    sent (`CPU Generator does not use offset`); the engine leaves them out there, and says so; on a
    GPU it sends them."""
    rng = random.Random(0)
    info = httpx.get(vllm + "/server_info", params={"config_format": "json"}, headers=AUTH).json()
    device = info["vllm_config"]["device_config"]["device"]

    async def main():
        engine = await connect(vllm)
        try:
            assert engine.send_seed is (device != "cpu"), device
            prompts = [[rng.randrange(3, 300) for _ in range(80)] for _ in range(64)]
            return await asyncio.gather(
                *(engine.generate(p, SamplingParams(max_new_tokens=8, seed=i)) for i, p in enumerate(prompts))
            )
        finally:
            await engine.close()

    assert all(len(g.token_ids) == 8 for g in asyncio.run(main()))
    assert httpx.get(vllm + "/health").status_code == 200


@pytest.fixture(scope="module")
def problems(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vllm-problems")
    rows = [{"problem": f"What is {i} * {i + 1}?", "answer": str(i * (i + 1))} for i in range(12)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "train.jsonl"


def test_rstar2_eval_on_vllm(vllm, model_dir, problems, tmp_path):
    out = tmp_path / "eval"
    args = ["eval", "--server", vllm, "--tokenizer", str(model_dir), "--bench", str(problems), "--limit", "4"]
    ok(cli([*args, "--out", str(out), "--samples", "2", "--max-tokens", "24", "--max-turns", "2"]))
    rows = [json.loads(x) for x in (out / problems.stem / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {r["turns"][0]["engine"] for r in rows} == {vllm}
    assert json.loads((out / "summary.json").read_text())["benchmarks"][problems.stem]["samples"] == 2


def train_on_vllm(
    vllm: str,
    model_dir: Path,
    problems: Path,
    run_dir: Path,
    k: int,
    lora: dict | None = None,
    lr: float | None = None,
    http: str | None = None,
) -> None:
    """`rstar2 train` for 3 steps at staleness ``k`` on the module's vLLM, steps kept; its metrics
    checked: every step once, vLLM sampling with the trainer's weights after every update. With
    ``http`` (a weight service's URL), vLLM fetches each load's folder from it first."""
    tree = small_rl(model_dir, problems, run_dir, steps=3, top_k=0)
    tree["model"]["lora"] = lora
    if lr is not None:
        tree["optim"]["lr"] = lr
    tree["rollout"]["engine"] = {"servers": [vllm], "max_batch_size": 8}
    tree["asynchronous"] = {"max_staleness": k}
    if k:
        tree["loss"] = {"tis_cap": 2.0}
    tree["run"]["keep_steps"] = True
    if http:
        tree["rollout"]["engine"]["weights_url"] = http
    before = httpx.get(http + "/health").json()["served"] if http else None
    ok(cli(["train", str(write_config(tree, run_dir.parent / "rl.yaml"))]))
    if http:  # a manifest for every load: the base, then 4 adapters
        served = httpx.get(http + "/health").json()["served"]
        assert served["manifests"] - before["manifests"] == 5, (before, served)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["sync/logprob_diff"] < TOL for r in rows), [r["sync/logprob_diff"] for r in rows]


@pytest.mark.parametrize("k", [0, 1], ids=["k=0", "k=1"])
def test_rl_on_vllm_trains_only_its_own_policys_tokens(vllm, model_dir, problems, tmp_path, k):
    """`rstar2 train` with `rollout.engine.servers` on vLLM: the run's start weights, then each update,
    reach the server in place; every token's version (from vLLM) is inside the bound; the server
    ends holding the final checkpoint's weights."""
    run_dir = tmp_path / "run"
    train_on_vllm(vllm, model_dir, problems, run_dir, k)
    ok(cli(["replay", str(run_dir), "--from", "1", "--to", "3"]))  # vLLM's tokens kept: bit for bit
    assert_versions_in_bound(run_dir, k)
    assert httpx.get(vllm + "/weight_info", headers=AUTH).json() == {"weight_version": "3"}
    final = run_dir / "checkpoints" / "step-000003"

    async def probe():
        engine = await connect(vllm)
        try:
            return await engine.generate([5, 6, 7, 8], SamplingParams(max_new_tokens=16))
        finally:
            await engine.close()

    gen = asyncio.run(probe())
    mine = trainer_logprobs(final, [5, 6, 7, 8], gen.token_ids, 1.0)
    assert float((torch.tensor(gen.logprobs) - mine).abs().max()) < TOL


@pytest.mark.parametrize("k, http", [(0, False), (1, False), (0, True)], ids=["k=0", "k=1", "k=0-http"])
def test_rl_with_an_adapter_on_vllm_sends_it_the_adapter_alone(
    vllm, model_dir, problems, tmp_path, k, http, weights_service
):
    """``model.lora`` on vLLM: the base in place once at the start, then each update's adapter
    loaded under a name of its own (``/v1/load_lora_adapter``); vLLM samples with the trainer's
    adapted model after every update, each token's version is the adapter's that sampled it.
    Over HTTP (``rstar2 launch`` without a shared filesystem), vLLM mirrors each folder first."""
    from rstar2.adapters import is_adapter
    from rstar2.engines.vllm_launch import LORA_SLOTS

    run_dir = tmp_path / "run"
    lora = {"rank": 4, "alpha": 8}
    train_on_vllm(
        vllm, model_dir, problems, run_dir, k, lora=lora, lr=5e-2, http=weights_service if http else None
    )
    if http:  # the route is behind the key, and fetches from its own service only
        mirror = {"source": "http://127.0.0.1:9", "folder": str(run_dir / "weights-latest")}
        assert httpx.post(vllm + "/mirror_weights", json=mirror).status_code == 401
        refused = httpx.post(vllm + "/mirror_weights", json=mirror, headers=AUTH)
        assert refused.status_code == 403 and "only from the service it was started with" in refused.text
    assert_versions_in_bound(run_dir, k)
    ok(cli(["replay", str(run_dir), "--from", "1", "--to", "3"]))
    assert is_adapter(run_dir / "weights-latest")
    # the base went in place once (version 0); the adapters of versions 0-3, the newest held
    assert httpx.get(vllm + "/weight_info", headers=AUTH).json() == {"weight_version": "0"}
    served = [m["id"] for m in httpx.get(vllm + "/v1/models", headers=AUTH).json()["data"]]
    held = sorted(m for m in served if m.startswith("rstar2-v"))
    assert len(held) <= LORA_SLOTS and any(m.startswith("rstar2-v3-") for m in held), served


def test_an_adapter_vllm_never_loaded_is_never_sampled(vllm, model_dir, problems, tmp_path):
    """verl #7495 on vLLM: a proxy answers "success" to the second adapter load without passing it
    on. The requests after it name an adapter vLLM does not hold: they fail, the step is not trained."""
    from .rl.test_lora import skipping_proxy

    run_dir = tmp_path / "run"
    with skipping_proxy(vllm, skip_from=2, route="v1/load_lora_adapter") as url:
        tree = small_rl(model_dir, problems, run_dir, steps=3, top_k=0)
        tree["model"]["lora"] = {"rank": 4, "alpha": 8}
        tree["rollout"]["engine"] = {"servers": [url], "max_batch_size": 8, "weight_check_tol": None}
        tree["rollout"]["scheduler"] = {"retries": 0}
        run = cli(["train", str(write_config(tree, tmp_path / "rl.yaml"))])
    said = " ".join(run.stderr.split())
    assert run.returncode == 1 and "does not exist" in said, said[-3000:]
    assert not (run_dir / "metrics.jsonl").exists() or len(read_metrics(run_dir / "metrics.jsonl")) <= 1


def test_a_miniature_recipe_on_a_vllm_it_starts(model_dir, recipe_out, tmp_path, api_key):
    """`vllm:` in a recipe: the run starts `rstar2 vllm` on its starting model, samples every
    filter, evaluation and RL stage there (each stage's model loaded in place first) and stops it."""
    from typer.testing import CliRunner

    from rstar2.cli import app

    need_vllm()
    tree = recipe_tree()
    tree["vllm"] = {"eager": True, "kv_cache_gib": 1}
    path = tmp_path / "vllm.yaml"
    path.write_text(yaml.safe_dump(tree))
    args = ["train", "--recipe", str(path), "--out", str(recipe_out), "--resume", "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert list(json.loads((recipe_out / "recipe_state.json").read_text())["evals"]) == [
        "start",
        "sft",
        "rl-64",
    ]
    files = recipe_out.glob("*/**/trajectories.jsonl")
    engines = {json.loads(x)["turns"][0]["engine"] for f in files for x in f.read_text().splitlines()}
    assert len(engines) == 1 and next(iter(engines)).startswith("http://127.0.0.1:")
    log = (recipe_out / "vllm.log").read_text()
    assert "Starting vLLM server" in log
    # each stage's starting model loaded before it sampled: the start's, then SFT's, then rl-64's own
    loads = re.findall(r"\[rstar2\] loaded (\S+): \d+ parameters", log)
    stages = [next((s for s in ("01-sft", "02-rl-64") if s in f), "start") for f in loads]
    assert stages[0] == "start" and "model-init" in loads[0], loads
    assert stages == sorted(stages, key=["start", "01-sft", "02-rl-64"].index), loads
    assert {"01-sft", "02-rl-64"} <= set(stages), loads
    with pytest.raises(httpx.HTTPError):  # stopped with the run
        httpx.get(next(iter(engines)) + "/health", timeout=5)
