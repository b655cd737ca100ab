"""What the trainer writes for servers and how it takes their refusals (``rl/run/sync.py``):
a refusal that asking again cannot change is not retried, and the weight files are readable by the
user the umask lets read them (a server may run as another user on a shared filesystem)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest

from rstar2.adapters import load_model
from rstar2.config import DEFAULT_ROLLOUT, LoraSection
from rstar2.engines.openai import OpenAIEngine, RequestRefused, ServerError
from rstar2.engines.vllm import VLLMEngine
from rstar2.rl.run import sync
from rstar2.rl.run.sync import WeightSyncError, reload_server, write_parts


class _Refusing:
    """A server's client whose every load fails with ``error``."""

    local = False

    def __init__(self, error: Exception):
        self.name, self.error, self.tries = "http://srv:8000", error, 0

    async def load_weights(self, update):
        self.tries += 1
        raise self.error


@pytest.fixture
def no_back_off(monkeypatch):
    async def instantly(seconds):
        pass

    monkeypatch.setattr(sync.asyncio, "sleep", instantly)


async def test_a_permanent_refusal_is_not_retried(no_back_off, tmp_path):
    """401 (the key), 403 (the folder is outside --weights-from) and a 400 saying nothing was loaded
    (weights of another model) fail at once; a 5xx, no answer, or a 400 a slow shared filesystem
    may cause (no files yet) are retried."""
    settings = DEFAULT_ROLLOUT.engine.model_copy(update={"reload_retries": 2})
    cases = [
        (RequestRefused("answered 403: not under a folder", status=403), 1),
        (RequestRefused("answered 401: unauthorized", status=401), 1),
        (RequestRefused("answered 400: tensors that do not fit; nothing was loaded", status=400), 1),
        (RequestRefused("answered 400: no *.safetensors files in /runs/r", status=400), 3),
        (ServerError("answered 503: starting", status=503), 3),
        (ServerError("ConnectError"), 3),
    ]
    for error, tries in cases:
        engine = _Refusing(error)
        with pytest.raises(WeightSyncError, match=f"{tries} tries"):
            await reload_server(engine, tmp_path, settings, 3)
        assert engine.tries == tries, error


async def test_the_status_a_server_answers_reaches_the_retry_rule(no_back_off, tmp_path):
    """Through the real clients: ``rstar2 serve``'s (or SGLang's) 403 answer, and rstar2's vLLM
    worker's answer that the folder was refused, carry their status."""
    asked = []

    def refusing(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/collective_rpc":
            refused = {"error": "FolderRefused: /etc is not under a folder", "status": 403}
            return httpx.Response(200, json={"results": [refused]})
        if request.url.path in ("/pause", "/update_weight_version"):
            return httpx.Response(200, json={})
        return httpx.Response(
            403, json={"detail": "/etc is not under a folder this server loads weights from"}
        )

    settings = DEFAULT_ROLLOUT.engine.model_copy(update={"reload_retries": 2})
    for kind in (OpenAIEngine, VLLMEngine):
        engine = kind("http://srv:8000")
        engine._client = httpx.AsyncClient(base_url=engine.base_url, transport=httpx.MockTransport(refusing))
        asked.clear()
        with pytest.raises(WeightSyncError, match="1 tries"):
            await reload_server(engine, tmp_path, settings, 3)
        assert asked.count("/collective_rpc" if kind is VLLMEngine else "/update_weights_from_disk") == 1
        await engine.close()


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_weight_files_take_the_trainers_umask_not_0600(tiny, tiny_dir, tmp_path, mask):
    """safetensors writes through a private temporary file (mode 0o600): a server running as
    another user could not read the weights published to it. They take 0o666 less the umask."""
    before = os.umask(mask)
    try:
        model = tiny[0]
        whole = write_parts(model, tmp_path / "whole", model.state_dict())
        adapted = load_model(tiny_dir, lora=LoraSection(rank=2))
        untied = {k: v for k, v in adapted.state_dict().items() if k != "lm_head.weight"}  # as gathered
        parts = write_parts(adapted, tmp_path / "adapter", untied, whole=True)
    finally:
        os.umask(before)
    folders = [folder for folder, _ in whole + parts]
    assert folders[1:] == [tmp_path / "adapter" / "base", tmp_path / "adapter"]
    files = [f for folder in folders for f in Path(folder).iterdir() if f.is_file()]
    assert any(f.suffix == ".safetensors" for f in files)
    modes = {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files}
    assert set(modes.values()) == {oct(0o666 & ~mask)}, modes
