"""Who may call rstar2's services (issue 26): ``rstar2 serve`` and ``rstar2 sandbox serve`` started
with an API key refuse a caller without it on every route but ``/health``; rstar2's clients send
``$RSTAR2_API_KEY``; a weight load reads only from under the server's ``--weights-from`` folders
and says nothing of paths outside them; a service on a routable address without a key warns."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import torch
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from rstar2.auth import (
    KEY_ENV,
    OPEN_ROUTES_ENV,
    FolderRefused,
    allowed_folder,
    authorized,
    exposed_warning,
    vllm_guard,
)
from rstar2.engines.base import SamplingParams
from rstar2.engines.kinds import connect
from rstar2.engines.openai import ServerError

from .conftest import free_port, start_cli, stop, wait_http

KEY = "test-key-0123456789"


def test_a_bearer_token_is_the_key_or_nothing():
    assert authorized(f"Bearer {KEY}", KEY) and authorized(f"bearer {KEY}", KEY)
    assert not authorized(None, KEY) and not authorized(KEY, KEY) and not authorized(f"Basic {KEY}", KEY)
    assert not authorized(f"Bearer {KEY}x", KEY) and not authorized("Bearer ", KEY)


def test_a_routable_address_without_a_key_is_warned_about():
    assert exposed_warning("127.0.0.1", None, "rstar2 serve") is None
    assert exposed_warning("::1", None, "rstar2 serve") is None
    assert exposed_warning("0.0.0.0", KEY, "rstar2 serve") is None
    said = exposed_warning("0.0.0.0", None, "rstar2 serve")
    assert said and "replace the weights" in said and KEY_ENV in said
    assert "run code" in exposed_warning("10.0.0.5", None, "rstar2 sandbox serve")
    # the code environment is warned about on a routable address even with a key
    assert "untrusted code" in exposed_warning("10.0.0.5", KEY, "rstar2 sandbox serve")
    assert exposed_warning("127.0.0.1", KEY, "rstar2 sandbox serve") is None


def test_weights_load_only_from_under_the_servers_folders(tmp_path):
    allowed, outside = tmp_path / "runs", tmp_path / "elsewhere"
    (allowed / "run" / "weights").mkdir(parents=True)
    outside.mkdir()
    (allowed / "escape").symlink_to(outside)
    assert allowed_folder(str(allowed / "run" / "weights"), [allowed.resolve()]) == (
        allowed / "run" / "weights"
    )
    refusals = []
    for path in (outside, tmp_path / "no-such-dir", allowed / "escape", allowed / ".." / "elsewhere"):
        with pytest.raises(FolderRefused) as refused:
            allowed_folder(str(path), [allowed.resolve()])
        refusals.append(str(refused.value).replace(str(path), "PATH"))
    assert len(set(refusals)) == 1  # the same words whether the path exists or not
    with pytest.raises(FolderRefused, match="started without --weights-from"):
        allowed_folder(str(allowed), [])
    # a file linked from inside an allowed folder to outside it: refused, whether its target exists
    (outside / "model.safetensors").write_bytes(b"secret")
    links = []
    for target in (outside / "model.safetensors", outside / "gone.safetensors", allowed / ".." / "x"):
        folder = allowed / "run" / f"linked-{len(links)}"
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").symlink_to(target)
        with pytest.raises(FolderRefused) as refused:
            allowed_folder(str(folder), [allowed.resolve()])
        links.append(str(refused.value).replace(str(folder), "PATH"))
    assert len(set(links)) == 1 and "model.safetensors links to a file that is not under" in links[0]
    (allowed / "run" / "weights" / "model.safetensors").write_bytes(b"w")
    (allowed / "run" / "inside").mkdir()
    (allowed / "run" / "inside" / "model.safetensors").symlink_to(
        allowed / "run" / "weights" / "model.safetensors"
    )
    assert allowed_folder(str(allowed / "run" / "inside"), [allowed.resolve()])  # a link that stays inside
    nested = allowed / "run" / "nested"  # a link one folder down, and a link loop
    (nested / "sub").mkdir(parents=True)
    (nested / "sub" / "adapter_model.safetensors").symlink_to(outside / "model.safetensors")
    with pytest.raises(
        FolderRefused, match="sub/adapter_model.safetensors links to a file that is not under"
    ):
        allowed_folder(str(nested), [allowed.resolve()])
    (allowed / "loop").symlink_to(allowed / "loop")
    with pytest.raises(FolderRefused, match="is not under a folder this server loads weights from"):
        allowed_folder(str(allowed / "loop"), [allowed.resolve()])


def test_vllms_development_routes_are_guarded_too(monkeypatch):
    """``rstar2 vllm`` adds ``vllm_guard`` to vLLM's server: vLLM's own ``--api-key`` guards only
    ``/v1`` and ``/inference``, not the routes that load and relabel weights."""
    app = FastAPI()
    app.middleware("http")(vllm_guard)

    async def echo(request: Request) -> dict:
        return {"body": (await request.body()).decode()}  # the route still reads what was sent

    for path in ("/collective_rpc", "/update_weight_version", "/pause", "/v1/completions"):
        app.post(path)(echo)
    app.get("/health")(lambda: {"ok": True})
    monkeypatch.setenv(KEY_ENV, KEY)
    client = TestClient(app)
    load = {"method": "rstar2_load", "kwargs": {"folder": "/runs/r/weights-latest"}}
    for path in ("/collective_rpc", "/update_weight_version", "/pause", "/v1/completions"):
        assert client.post(path, json=load).status_code == 401
        assert client.post(path, json=load, headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = client.post(path, json=load, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and "rstar2_load" in ok.json()["body"]
    assert client.get("/health").status_code == 200
    # vLLM's own reload_weights reads any path: not through rstar2's server, key or not, whatever
    # root path the server sits under and however the route is spelt
    other = {"method": "reload_weights", "kwargs": {"weights_path": "/etc"}}
    auth = {"Authorization": f"Bearer {KEY}"}
    refused = client.post("/collective_rpc", json=other, headers=auth)
    assert refused.status_code == 403 and "rstar2_load" in refused.text
    under = TestClient(app, root_path="/api")
    for path in ("/collective_rpc", "/api/collective_rpc", "/collective_rpc/"):
        assert under.post(path, json=other, headers=auth).status_code == 403, path
    assert under.get("/api/health").status_code == 200  # /health stays open under a root path
    # the routes that change or free the weights outside rstar2's loads: closed unless opened
    for path in ("/sleep", "/weight_checker", "/update_weights", "/a_route_of_a_newer_vllm"):
        app.post(path)(echo)
        assert client.post(path, json={}, headers=auth).status_code == 403
        assert under.post("/api" + path, json={}, headers=auth).status_code == 403
    monkeypatch.setenv(OPEN_ROUTES_ENV, "/sleep")
    assert client.post("/sleep", json={}, headers=auth).status_code == 200
    assert client.post("/sleep", json={}).status_code == 401  # opened, still behind the key
    assert client.post("/weight_checker", json={}, headers=auth).status_code == 403


@pytest.fixture(scope="module")
def keyed_server(tiny_dir, tmp_path_factory):
    """``rstar2 serve`` with an API key, loading weights only from under one folder."""
    allowed = tmp_path_factory.mktemp("allowed")
    port = free_port()
    args = ["serve", "--model", str(tiny_dir), "--port", str(port), "--device", "cpu"]
    proc = start_cli([*args, "--api-key", KEY, "--weights-from", str(allowed)])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url, proc, timeout=180)
        yield url, allowed
    finally:
        stop(proc)


def test_rstar2_serve_refuses_a_caller_without_its_key(keyed_server):
    url, _ = keyed_server
    body = {"prompt": [5, 6, 7], "max_tokens": 2}
    assert httpx.get(url + "/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        for method, path, json in (
            ("POST", "/v1/completions", body),
            ("POST", "/update_weights_from_disk", {"model_path": "/", "weight_version": "1"}),
            ("GET", "/get_server_info", None),
            ("GET", "/v1/models", None),
        ):
            r = httpx.request(method, url + path, json=json, headers=headers, timeout=60)
            assert r.status_code == 401 and "API key" in r.text, (path, headers, r.status_code)
    ok = httpx.post(
        url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    )
    assert ok.status_code == 200


def test_rstar2_serve_loads_weights_only_from_its_folders(keyed_server, tiny, tmp_path):
    from safetensors.torch import save_file

    url, allowed = keyed_server
    auth = {"Authorization": f"Bearer {KEY}"}

    def load(folder: Path) -> httpx.Response:
        body = {"model_path": str(folder), "weight_version": "3"}
        return httpx.post(url + "/update_weights_from_disk", json=body, headers=auth, timeout=120)

    before = httpx.get(url + "/get_server_info", headers=auth).json()
    tiny[0].save_pretrained(tmp_path)  # a whole model, outside the folder
    refused = [load(p) for p in (tmp_path, tmp_path / "no-such-dir", allowed / ".." / tmp_path.name)]
    assert all(r.status_code == 403 for r in refused), [r.text for r in refused]
    assert len({r.json()["detail"].split(" is not under")[1] for r in refused}) == 1  # same words

    misfit = allowed / "misfit"
    misfit.mkdir()
    name = next(iter(tiny[0].state_dict()))
    save_file({name: torch.zeros(3, 3)}, str(misfit / "model.safetensors"))
    r = load(misfit)
    # refused from the files' headers, before their data is read (the engine's own check says
    # "the new weights do not fit the model", after)
    assert r.status_code == 400 and name in r.text and "do not fit the served model" in r.text
    assert (
        httpx.get(url + "/get_server_info", headers=auth).json()["weights_fingerprint"]
        == (before["weights_fingerprint"])
    )

    linked = allowed / "linked"  # the model's tensors a link inside the folder to a file outside it
    linked.mkdir()
    (linked / "model.safetensors").symlink_to(tmp_path / "model.safetensors")
    r = load(linked)
    assert r.status_code == 403 and "model.safetensors links to a file that is not under" in r.text

    tiny[0].save_pretrained(allowed / "good")
    r = load(allowed / "good")
    assert r.status_code == 200 and r.json()["weights_version"] == 3


def test_rstar2s_client_sends_the_key_from_the_environment(keyed_server, monkeypatch):
    url, _ = keyed_server

    async def sample():
        engine = await connect(url)
        try:
            return await engine.generate([5, 6, 7], SamplingParams(max_new_tokens=3))
        finally:
            await engine.close()

    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ServerError, match=f"refused.*401.*{KEY_ENV}"):
        asyncio.run(sample())
    monkeypatch.setenv(KEY_ENV, KEY)
    assert len(asyncio.run(sample()).token_ids) == 3


def test_a_key_given_to_the_client_is_sent(keyed_server, monkeypatch):
    """``OpenAIEngine(url, api_key=...)``, for a caller in Python: the key given, not the environment's."""
    from rstar2.engines.openai import OpenAIEngine

    url, _ = keyed_server
    monkeypatch.setenv(KEY_ENV, "wrong")

    async def sample(key):
        engine = OpenAIEngine(url, api_key=key, retries=0)
        try:
            return await engine.generate([5, 6, 7], SamplingParams(max_new_tokens=3))
        finally:
            await engine.close()

    with pytest.raises(ServerError, match="401"):
        asyncio.run(sample(None))
    assert len(asyncio.run(sample(KEY)).token_ids) == 3


def test_the_sandbox_service_refuses_a_caller_without_its_key(monkeypatch):
    from rstar2.sandbox.client import Client

    port = free_port()
    proc = start_cli(["sandbox", "serve", "--port", str(port), "--workers", "1", "--api-key", KEY])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url, proc, timeout=120)
        r = httpx.post(url + "/run", json={"code": "print(6 * 7)"}, timeout=60)
        assert r.status_code == 401

        async def run(key: str | None):
            async with Client(url, api_key=key, retries=0, retry_for_s=0) as client:
                return await client.run("print(6 * 7)")

        monkeypatch.delenv(KEY_ENV, raising=False)
        refused = asyncio.run(run(None))
        assert refused.status == "rejected" and "401" in refused.reason and KEY_ENV in refused.reason
        assert asyncio.run(run(KEY)).stdout == "42\n"
        monkeypatch.setenv(KEY_ENV, KEY)  # rstar2's clients take it from the environment
        assert asyncio.run(run(None)).stdout == "42\n"
    finally:
        stop(proc)
