"""Weights over HTTP (``rstar2.weight_transfer``): the trainer's side serves only its folders and only
with the key; a mirror arrives whole and checked, or not at all; a file already here is not fetched
again; a file cut or changed on the way is refused and removed, never loaded."""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from rstar2.auth import FolderRefused
from rstar2.weight_transfer import MirrorError, WeightService, _mirror, mirror

from .conftest import wait_http

KEY = "transfer-test-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}


@contextmanager
def service(roots: list[Path], kind: type = WeightService):
    served = kind(roots, KEY)
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    try:
        wait_http(f"http://127.0.0.1:{served.port}")
        yield f"http://127.0.0.1:{served.port}"
    finally:
        served.shutdown()
        thread.join(10)


@pytest.fixture
def run(tmp_path) -> Path:
    folder = tmp_path / "run" / "weights-latest"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    (folder / "config.json").write_text('{"n": 1}')
    (folder / "trainer_state.pt").write_bytes(b"optimizer")  # not what a load reads: never sent
    (folder / "base").mkdir()  # a sub-folder: mirrored on its own
    return folder


def test_the_service_serves_its_folders_to_the_key_only(run, tmp_path):
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "x.json").write_text("{}")
    (run / "link.json").symlink_to(tmp_path / "secret" / "x.json")
    with service([run.parent]) as url:
        listed = {"folder": str(run)}
        assert httpx.get(f"{url}/weights/manifest", params=listed).status_code == 401
        answer = httpx.get(f"{url}/weights/manifest", params=listed, headers=HEADERS).json()
        assert [f["name"] for f in answer["files"]] == ["config.json", "model.safetensors"]
        outside = {"folder": str(tmp_path / "secret")}
        assert httpx.get(f"{url}/weights/manifest", params=outside, headers=HEADERS).status_code == 403
        up = {"folder": str(run / ".."), "name": "../secret/x.json"}
        assert httpx.get(f"{url}/weights/file", params=up, headers=HEADERS).status_code in (403, 404)
        linked = {"folder": str(run), "name": "link.json"}
        assert httpx.get(f"{url}/weights/file", params=linked, headers=HEADERS).status_code == 404


def test_a_mirror_arrives_whole_once_and_keeps_sub_folders(run, tmp_path):
    here = tmp_path / "engine" / "weights-latest"
    (here / "base").mkdir(parents=True)
    (here / "base" / "model.safetensors").write_bytes(b"the base, mirrored before")
    (here / "old.safetensors").write_bytes(b"a file the folder no longer holds")
    with service([run.parent]) as url:
        first = _mirror(url, str(run), here, KEY)
        assert (
            first["fetched"] == first["bytes"] == (run / "model.safetensors").stat().st_size + len('{"n": 1}')
        )
        assert (here / "model.safetensors").read_bytes() == (run / "model.safetensors").read_bytes()
        assert not (here / "old.safetensors").exists() and not (here / "trainer_state.pt").exists()
        assert (here / "base" / "model.safetensors").exists()
        assert _mirror(url, str(run), here, KEY)["fetched"] == 0  # this version is here already
        (run / "config.json").write_text('{"n": 2}')  # the next version
        assert _mirror(url, str(run), here, KEY)["fetched"] == len('{"n": 2}')
        assert json.loads((here / "config.json").read_text()) == {"n": 2}
        # the trainer's own folder (one disk): nothing fetched, nothing rewritten
        before = (run / "model.safetensors").stat().st_mtime_ns
        assert asyncio.run(mirror(url, str(run), [run.parent], KEY, pinned=url))["fetched"] == 0
        assert (run / "model.safetensors").stat().st_mtime_ns == before


class FlippingAByte(WeightService):
    """The real service, but the first byte of every file it sends flipped on the way."""

    def send_file(self, handler, path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[0] ^= 1
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(bytes(data))


def test_a_file_changed_on_the_way_is_refused_and_removed(run, tmp_path):
    here = tmp_path / "engine" / "weights-latest"
    with service([run.parent], FlippingAByte) as url:
        with pytest.raises(MirrorError, match="arrived as"):
            _mirror(url, str(run), here, KEY)
        assert not (here / "config.json").exists() and not list(here.glob(".*.part"))
    with service([run.parent]) as url, pytest.raises(MirrorError, match="refused the manifest"):
        _mirror(url, str(run), here, "a wrong key")


def test_a_mirror_writes_only_under_the_servers_folders_from_its_own_service(run, tmp_path):
    pinned = "http://127.0.0.1:9"
    with pytest.raises(FolderRefused, match="not under a folder"):
        asyncio.run(mirror(pinned, str(run), [tmp_path / "elsewhere"], KEY, pinned=pinned))
    with pytest.raises(FolderRefused, match="not under a folder"):  # a root itself: a starting model
        asyncio.run(mirror(pinned, str(run), [run], KEY, pinned=pinned))
    for other in (None, "http://127.0.0.1:10"):
        with pytest.raises(FolderRefused, match="only from the service it was started with"):
            asyncio.run(mirror(pinned, str(run), [run.parent], KEY, pinned=other))
