"""A weight load reads what was checked (issue "Trust, third pass"): the ``--weights-from`` check
covers hard links and the files as opened (``auth.open_under``, ``auth.opened_folder``), a relative
path is taken under the roots only, and vLLM's adapter route is handed the folder checked and
refuses ``load_inplace``."""

from __future__ import annotations

import asyncio
import copy
import json
import os

import pytest
import torch
from fastapi import FastAPI, HTTPException, Request
from fastapi.testclient import TestClient

from rstar2.auth import (
    KEY_ENV,
    WEIGHTS_FROM_ENV,
    FolderRefused,
    allowed_folder,
    open_under,
    opened_folder,
    vllm_guard,
)

KEY = "test-key-0123456789"


@pytest.fixture
def roots(tmp_path):
    """An allowed root holding ``run/weights`` (a file in it), and a folder outside it with a secret."""
    root, outside = tmp_path / "runs", tmp_path / "elsewhere"
    (root / "run" / "weights").mkdir(parents=True)
    (root / "run" / "weights" / "model.safetensors").write_bytes(b"inside")
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    return root.resolve(), outside


def test_a_hard_link_to_a_file_outside_the_roots_is_refused(roots):
    """A hard link is the file itself under a second name: nothing in its path says the other lies
    outside, so a file with other links is refused, at the check and on the open file."""
    root, outside = roots
    weights = root / "run" / "weights"
    assert allowed_folder(str(weights), [root]) == weights
    os.link(outside / "secret", weights / "tokenizer.json")
    with pytest.raises(FolderRefused, match="tokenizer.json: a file with other hard links"):
        allowed_folder(str(weights), [root])
    with pytest.raises(FolderRefused, match="other hard links"):
        open_under(weights / "tokenizer.json", [root])
    os.unlink(weights / "tokenizer.json")
    fd = open_under(weights / "model.safetensors", [root])
    try:
        assert os.read(fd, 100) == b"inside"
    finally:
        os.close(fd)


def test_what_is_opened_is_checked_again_whatever_the_folder_became(roots):
    """Checked, then a file made a link out (or a hard link) before the load opens it: refused on
    opening; a file opened, then replaced: what is read is the file opened."""
    root, outside = roots
    weights = root / "run" / "weights"
    real = allowed_folder(str(weights), [root])
    (weights / "model.safetensors").unlink()
    (weights / "model.safetensors").symlink_to(outside / "secret")
    with pytest.raises(FolderRefused), opened_folder(real, [root]):
        pass
    (weights / "model.safetensors").unlink()
    os.link(outside / "secret", weights / "model.safetensors")
    with pytest.raises(FolderRefused, match="other hard links"), opened_folder(real, [root]):
        pass
    (weights / "model.safetensors").unlink()
    (weights / "model.safetensors").write_bytes(b"checked")
    (weights / "sub").mkdir()  # a folder's sub-folders are not part of its load
    with opened_folder(real, [root]) as private:
        (weights / "model.safetensors").unlink()
        (weights / "model.safetensors").symlink_to(outside / "secret")
        assert sorted(p.name for p in private.iterdir()) == ["model.safetensors"]
        assert (private / "model.safetensors").read_bytes() == b"checked"
    assert not private.exists()
    # a folder of the path made a link since the check: no name on the way is followed
    moved = root / "run" / "moved"
    (weights / "model.safetensors").unlink()
    (weights / "model.safetensors").write_bytes(b"checked")
    weights.rename(moved)
    weights.symlink_to(outside)
    with pytest.raises(FolderRefused), opened_folder(real, [root]):
        pass


def test_a_relative_path_is_taken_under_the_roots_never_the_working_folder(roots, monkeypatch):
    """vLLM would fetch a relative adapter path that is no folder from the Hugging Face Hub: one is
    taken under each root, must be a folder there, and is answered as its absolute path."""
    root, outside = roots
    other = outside / "second-root"
    (other / "adapter").mkdir(parents=True)
    monkeypatch.chdir(root)  # the server's working folder under a root
    assert allowed_folder("run/weights", [root]) == root / "run" / "weights"
    assert allowed_folder("adapter", [root, other.resolve()]) == (other / "adapter").resolve()
    said = []
    for path in ("HuggingFaceTB/SmolLM2-135M-lora", "run/no-such", "../elsewhere", str(root / "no-such")):
        with pytest.raises(FolderRefused) as refused:
            allowed_folder(path, [root])
        said.append(str(refused.value).replace(path, "PATH"))
    assert len(set(said)) == 1, said  # the same words whether the path exists or not
    monkeypatch.chdir(root / "run")  # not taken under the working folder either
    with pytest.raises(FolderRefused):
        allowed_folder("weights", [root])


def test_vllms_adapter_route_gets_the_folder_checked_and_refuses_load_inplace(roots, monkeypatch):
    """``/v1/load_lora_adapter``: the path vLLM reads is the absolute folder checked (never a name
    for the Hub); ``load_inplace`` would swap the weights under a name rstar2 maps to one version."""
    root, _ = roots
    app = FastAPI()
    app.middleware("http")(vllm_guard)

    @app.post("/v1/load_lora_adapter")
    async def load(request: Request) -> dict:
        return json.loads(await request.body())

    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv(WEIGHTS_FROM_ENV, str(root))
    monkeypatch.chdir(root)
    client, auth = TestClient(app), {"Authorization": f"Bearer {KEY}"}
    body = {"lora_name": "rstar2-v3-ab", "lora_path": "run/weights"}
    ok = client.post("/v1/load_lora_adapter", json=body, headers=auth)
    assert ok.status_code == 200 and ok.json()["lora_path"] == str(root / "run" / "weights"), ok.text
    for inplace in (True, "true", 1):
        refused = client.post("/v1/load_lora_adapter", json={**body, "load_inplace": inplace}, headers=auth)
        assert refused.status_code == 403 and "load_inplace is refused" in refused.text, inplace
    assert client.post("/v1/load_lora_adapter", json={**body, "load_inplace": False}, headers=auth).is_success
    hub = client.post("/v1/load_lora_adapter", json={**body, "lora_path": "org/adapter"}, headers=auth)
    assert hub.status_code == 403 and "is not under a folder" in hub.text


def test_rstar2_serve_loads_the_files_it_opened_and_checked(tiny, roots, monkeypatch):
    """``ServedWeights.load`` reads each file through the descriptor it checked: a file replaced
    after it was opened is not read, and a hard link in the folder is refused (403) before anything
    is read."""
    from safetensors.torch import save_file

    from rstar2.engines.hf import HFEngine
    from rstar2.engines.served_weights import ServedWeights

    model, _ = tiny
    root, outside = roots
    served = ServedWeights(HFEngine(copy.deepcopy(model)), [root])
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    checked = {k: v + 0.5 for k, v in state.items()}
    weights = root / "run" / "weights"
    save_file(checked, str(weights / "model.safetensors"))
    save_file({k: v - 0.5 for k, v in state.items()}, str(outside / "other.safetensors"))
    opened = ServedWeights.load_opened

    async def swapped_after_opening(self, folder, private, version):
        (weights / "model.safetensors").unlink()
        (weights / "model.safetensors").symlink_to(outside / "other.safetensors")
        return await opened(self, folder, private, version)

    monkeypatch.setattr(ServedWeights, "load_opened", swapped_after_opening)
    assert asyncio.run(served.load(str(weights), "3")) == len(checked)
    held = served.engine.model.state_dict()
    assert all(torch.equal(held[k], v) for k, v in checked.items())
    assert served.held()["weights_path"] == str(weights)

    monkeypatch.setattr(ServedWeights, "load_opened", opened)
    (weights / "model.safetensors").unlink()
    os.link(outside / "other.safetensors", weights / "model.safetensors")
    with pytest.raises(HTTPException) as refused:
        asyncio.run(served.load(str(weights), "4"))
    assert refused.value.status_code == 403 and "other hard links" in refused.value.detail
    assert all(torch.equal(served.engine.model.state_dict()[k], v) for k, v in checked.items())
