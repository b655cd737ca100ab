"""Weights over HTTP, for engines that do not share the trainer's filesystem (``rstar2 launch`` with
``cluster.shared_fs: false``). The trainer's node serves its run folder read-only, with the key: a
folder's manifest (each file's size and CRC-32), then each file. An engine's server mirrors a
folder it is told to load into the same path on its own disk (under its ``--weights-from``),
checking each file's size and checksum, then loads it as it loads any folder: the version, the
fingerprint and the probe that follow are the folder road's. A folder's sub-folders are mirrored
on their own (an adapter's ``base/``, sent before it), so a mirror keeps them.

Imports only the standard library and ``auth``: it also runs inside vLLM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import sys
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor, wait
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from .auth import (
    FETCH_FROM_ENV,
    KEY_ENV,
    WEIGHTS_FROM_ENV,
    FolderRefused,
    authorized,
    client_headers,
    exposed_warning,
    route,
)

CHUNK = 8 << 20
LOADED = (".safetensors", ".json", ".jinja", ".txt", ".model")  # what a load reads (not optimizer state)
MANIFEST, FILE, CHECKSUM = "/weights/manifest", "/weights/file", "/weights/checksum"
_crcs: dict[tuple[str, int, int], int] = {}  # (path, size, mtime) -> CRC-32: each version hashed once


def checksum(path: Path) -> int:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _crcs:
        crc = 0
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK):
                crc = zlib.crc32(chunk, crc)
        _crcs[key] = crc
    return _crcs[key]


def served_folder(roots: list[Path], folder: str) -> Path:
    """``folder`` when it is a folder under one of ``roots`` (links not followed out of them)."""
    path = Path(folder).resolve()
    if not any(path.is_relative_to(r) for r in roots) or not path.is_dir():
        raise FolderRefused(f"{folder} is not a folder of the run this service serves")
    return path


def manifest(folder: Path) -> dict[str, Any]:
    """The folder's own files a load reads (not its sub-folders, links or optimizer state), each with
    what tells its version: size, modification time and which file it is (device and inode)."""
    files = sorted(p for p in folder.iterdir() if loaded(p))
    return {"files": [{"name": p.name, **stamp(p)} for p in files]}


def loaded(path: Path) -> bool:
    """A file of a model folder that a load reads (not a link, nor a mirror's own notes, ``.mirrored.json``)."""
    return (
        path.suffix in LOADED and not path.name.startswith(".") and path.is_file() and not path.is_symlink()
    )


def stamp(path: Path) -> dict[str, Any]:
    """What tells a file's version, and which file it is: its device and inode on this boot of this
    machine (another machine's are other numbers, whatever they are)."""
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "file": f"{BOOT}:{stat.st_dev}:{stat.st_ino}"}


try:
    BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
except OSError:
    BOOT = uuid.uuid4().hex  # no boot id: no file here is ever taken for a served one


class WeightService(ThreadingHTTPServer):
    """The trainer's side, on the standard library's threaded HTTP server: ``GET /weights/manifest?
    folder=``, ``/weights/file?folder=&name=`` (sent with ``sendfile``: no copy through Python) and
    ``/weights/checksum?folder=&name=`` (each file's CRC-32, begun in the background when its
    manifest is asked, so it is ready when the file has arrived); ``/health`` open, the rest only
    with the key."""

    daemon_threads = True

    def __init__(self, roots: list[Path], key: str | None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.roots, self.key = [r.resolve() for r in roots], key
        self.served = {"manifests": 0, "files": 0, "bytes": 0}  # what it sent, for whoever watches the run
        self.checksums = ThreadPoolExecutor(1)
        self.pending: dict[str, Any] = {}
        super().__init__((host, port), _Handler)
        self.port = self.server_address[1]

    def shutdown(self) -> None:
        super().shutdown()
        self.server_close()
        self.checksums.shutdown(wait=False)

    def send_file(self, handler: Any, path: Path) -> None:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            handler.send_response(200)
            handler.send_header("Content-Type", "application/octet-stream")
            handler.send_header("Content-Length", str(size))
            handler.end_headers()
            handler.wfile.flush()
            handler.connection.sendfile(fh, 0, size)
        self.served["files"] += 1
        self.served["bytes"] += size


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # one connection for a mirror's requests
    disable_nagle_algorithm = True  # an answer's head and body apart met delayed ACKs: 40 ms each

    def log_message(self, *args: Any) -> None:  # quiet: a request a file and a load
        pass

    def answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        service = self.server
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path == "/health":
            return self.answer(
                200,
                {"status": "ok", "roots": [str(r) for r in service.roots], "served": service.served},
            )
        if service.key and not authorized(self.headers.get("Authorization"), service.key):
            return self.answer(
                401,
                {"error": "unauthorized: send the service's API key as 'Authorization: Bearer KEY'"},
            )
        try:
            folder = served_folder(service.roots, query.get("folder", ""))
            if url.path == MANIFEST:
                listed = manifest(folder)
                for entry in listed["files"]:  # its checksums begun now: ready when asked
                    path = folder / entry["name"]
                    service.pending[str(path)] = service.checksums.submit(checksum, path)
                service.served["manifests"] += 1
                return self.answer(200, listed)
            path = folder / query.get("name", "")
            if path.parent != folder or not loaded(path):
                return self.answer(404, {"error": "no such file in that folder"})
            if url.path == CHECKSUM:
                ahead = service.pending.get(str(path))
                crc = ahead.result() if ahead is not None else checksum(path)
                return self.answer(200, {"crc32": crc, **stamp(path)})
            if url.path == FILE:
                return service.send_file(self, path)
            return self.answer(404, {"error": f"no route {url.path}"})
        except FolderRefused as exc:
            return self.answer(403, {"error": str(exc)})


class MirrorError(RuntimeError):
    """A folder did not arrive whole: refused, cut short, or not what the manifest said."""


async def mirror(
    source: str, folder: str, roots: list[Path], key: str | None = None, *, pinned: str | None = None
) -> dict[str, Any]:
    """``folder`` of the service at ``source`` into the same path here (off the event loop). A
    server mirrors only from the service it was started with (``pinned``: ``--fetch-from``), so a
    caller cannot make it send its key elsewhere or write what another service lists."""
    if pinned is None or source.rstrip("/") != pinned.rstrip("/"):
        raise FolderRefused(
            f"this server fetches weights only from the service it was started with (--fetch-from "
            f"{pinned or 'none: it fetches none'}), not {source}"
        )
    # written to ``folder`` itself, under one of ``roots`` (a root's own files are a server's starting model)
    target = Path(folder).resolve()
    if not any(target.is_relative_to(r) and target != r for r in roots):
        raise FolderRefused(f"{folder} is not under a folder this server loads weights from (--weights-from)")
    return await asyncio.to_thread(_mirror, source, folder, target, key)


def _mirror(source: str, folder: str, target: Path, key: str | None) -> dict[str, Any]:
    """File by file, each checked by size and CRC-32 once it has arrived; a file already here (the
    trainer's own, on one disk, or one this node fetched before: ``.mirrored.json`` says which
    version each is) is not fetched again; one that did not arrive whole is removed, so nothing
    loads it; files the folder no longer holds go. The engines of one node take turns (a lock
    file), so they never write one file at once."""
    import fcntl

    start = time.perf_counter()
    target.mkdir(parents=True, exist_ok=True)
    fetched = 0
    record_file = target / ".mirrored.json"
    with _Service(source, key) as service, open(target / ".mirror.lock", "w") as lock:
        status, body = service.get(MANIFEST, folder=folder)
        if status != 200:
            raise MirrorError(f"{source} refused the manifest of {folder} ({status}: {body[:200]!r})")
        files = json.loads(body)["files"]
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = json.loads(record_file.read_text()) if record_file.exists() else {}
        for entry in files:
            name, path = entry["name"], target / entry["name"]
            if "/" in name or name in ("", ".", ".."):
                raise MirrorError(f"{source} listed a file name that is not one: {name!r}")
            here = stamp(path) if path.is_file() else None
            kept = record.get(name, {})
            if here and (
                here["file"] == entry["file"] or (kept.get("source") == entry and kept.get("here") == here)
            ):
                continue  # the trainer's own file, or this version fetched before
            part = target / f".{name}.part"
            if path.is_file():  # the last version's file, written over (see fetch)
                os.replace(path, part)
            record.pop(name, None)
            try:
                size, crc = service.fetch(folder, name, part)
                status, body = service.get(CHECKSUM, folder=folder, name=name)
                sent = json.loads(body) if status == 200 else {}
                expected = (entry["size"], sent.get("crc32"), entry["mtime_ns"])
                if (size, crc, sent.get("mtime_ns")) != expected:
                    raise MirrorError(
                        f"{folder}/{name} arrived as {size} bytes, CRC-32 {crc:#010x}; the service sent "
                        f"{entry['size']} bytes, CRC-32 {sent.get('crc32')} ({status}; a file rewritten meanwhile "
                        "differs too)"
                    )
            except BaseException:
                part.unlink(missing_ok=True)
                raise
            os.replace(part, path)
            record[name] = {"source": entry, "here": stamp(path)}
            fetched += size
        names = {e["name"] for e in files}
        for stale in target.iterdir():
            if loaded(stale) and stale.name not in names:
                stale.unlink()
        record_file.write_text(json.dumps({k: v for k, v in record.items() if k in names}))
    return {
        "files": len(files),
        "bytes": sum(e["size"] for e in files),
        "fetched": fetched,
        "seconds": round(time.perf_counter() - start, 3),
    }


class _Service:
    """The trainer's weight service through the standard library's client: a file read straight
    into one buffer, 8 MiB at a time (httpx's 64 KiB reads held a 500 MB file to ~350 MB/s)."""

    def __init__(self, source: str, key: str | None) -> None:
        url = urlsplit(source)
        kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        self.conn = kind(url.hostname, url.port, timeout=600)
        self.headers = client_headers(key)
        self.buffers = [memoryview(bytearray(CHUNK)) for _ in range(2)]
        self.writer = ThreadPoolExecutor(1)

    def __enter__(self) -> _Service:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.conn.close()
        self.writer.shutdown()

    def request(self, path: str, **query: str) -> Any:
        try:
            self.conn.request("GET", f"{path}?{urlencode(query)}", headers=self.headers)
            return self.conn.getresponse()
        except OSError as exc:
            raise MirrorError(f"the weight service did not answer {path}: {exc}") from None

    def get(self, path: str, **query: str) -> tuple[int, bytes]:
        resp = self.request(path, **query)
        return resp.status, resp.read()

    def fetch(self, folder: str, name: str, into: Path) -> tuple[int, int]:
        """A file into ``into``: its size and CRC-32, as received. Two buffers: one is filled from
        the socket while a thread checksums and writes the other."""
        resp = self.request(FILE, folder=folder, name=name)
        if resp.status != 200:
            raise MirrorError(
                f"the weight service refused {folder}/{name} ({resp.status}: {resp.read()[:200]!r})"
            )
        buffers, size, crc = self.buffers, 0, 0

        def put(chunk: memoryview, crc: int) -> int:
            out.write(chunk)
            return zlib.crc32(chunk, crc)

        # over the last version's blocks where there is one (5x faster than a truncated or new file
        # on ext4: no blocks freed and allocated again), cut to size at the end
        with open(into, "r+b" if into.is_file() else "wb") as out:
            pending, turn = None, 0
            try:
                while n := resp.readinto(buffers[turn % 2]):
                    crc = pending.result() if pending is not None else crc
                    pending = self.writer.submit(put, buffers[turn % 2][:n], crc)
                    size, turn = size + n, turn + 1
                crc = pending.result() if pending is not None else crc
            except (OSError, http.client.HTTPException) as exc:
                raise MirrorError(f"{folder}/{name} was cut off after {size} bytes: {exc!r}") from None
            finally:  # no write still running once the file is closed
                if pending is not None:
                    wait([pending])
            out.truncate(size)
        return size, crc


async def vllm_mirror(request: Any, call_next: Any) -> Any:
    """``/mirror_weights`` inside vLLM's API server, as ``rstar2 serve`` answers it (``rstar2 vllm``
    adds it inside ``auth.vllm_guard``, which has checked the key by then)."""
    if route(request) != "/mirror_weights":
        return await call_next(request)
    from starlette.responses import JSONResponse

    try:
        body = json.loads(await request.body() or b"{}")
        roots = [Path(p) for p in os.environ.get(WEIGHTS_FROM_ENV, "").split(os.pathsep) if p]
        pinned = os.environ.get(FETCH_FROM_ENV) or None
        return JSONResponse(
            await mirror(body["source"], body["folder"], roots, os.environ.get(KEY_ENV), pinned=pinned)
        )
    except (ValueError, KeyError, TypeError, FolderRefused, MirrorError) as exc:
        status = 403 if isinstance(exc, FolderRefused) else 502 if isinstance(exc, MirrorError) else 400
        return JSONResponse({"error": f"/mirror_weights: {exc}"}, status_code=status)


def main() -> None:
    """``python -m rstar2.weight_transfer --root RUN``: the trainer's side (its key: ``$RSTAR2_API_KEY``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, action="append", required=True, help="A folder served (repeat).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090, help="0: any free port (the one said).")
    args = parser.parse_args()
    key = os.environ.get(KEY_ENV)
    if said := exposed_warning(args.host, key, "the weight service"):
        print(f"[rstar2] {said}", file=sys.stderr)
    try:
        service = WeightService(args.root, key, args.host, args.port)
    except OSError as exc:  # a port taken: one line, no traceback
        sys.exit(f"error: the weight service cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
    host = service.server_address[0]  # what it is bound to, not what was asked
    print(f"[rstar2] weight service on http://{host}:{service.port}", file=sys.stderr, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        service.serve_forever()


if __name__ == "__main__":
    main()
