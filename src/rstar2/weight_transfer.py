"""Weights over HTTP, for engines that do not share the trainer's filesystem (``rstar2 launch`` with
``cluster.shared_fs: false``). The trainer's node serves its run folder read-only, with the key: a
folder's manifest (each file's size and CRC-32), then each file. An engine's server mirrors a
folder it is told to load into the same path on its own disk (under its ``--weights-from``),
checking each file's size and checksum, then loads it as it loads any folder: the version, the
fingerprint and the probe that follow are the folder road's. A folder's sub-folders are mirrored
on their own (an adapter's ``base/``, sent before it), so a mirror keeps them.

Imports only the standard library, httpx and Starlette, and ``auth``: it also runs inside vLLM."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import zlib
from pathlib import Path
from typing import Any

from .auth import KEY_ENV, FolderRefused, client_headers, key_guard

CHUNK = 8 << 20
LOADED = (".safetensors", ".json", ".jinja", ".txt", ".model")  # what a load reads (not optimizer state)
MANIFEST, FILE = "/weights/manifest", "/weights/file"
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
    its size and CRC-32."""
    files = sorted(p for p in folder.iterdir() if p.suffix in LOADED and p.is_file() and not p.is_symlink())
    return {"files": [{"name": p.name, "size": p.stat().st_size, "crc32": checksum(p)} for p in files]}


def service_app(roots: list[Path], key: str | None) -> Any:
    """The trainer's side: ``GET /weights/manifest?folder=`` and ``GET /weights/file?folder=&name=``."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.responses import FileResponse, JSONResponse
    from starlette.routing import Route

    roots = [r.resolve() for r in roots]

    async def health(request: Any) -> Any:
        return JSONResponse({"status": "ok", "roots": [str(r) for r in roots]})

    async def listed(request: Any) -> Any:
        try:
            folder = served_folder(roots, request.query_params.get("folder", ""))
            return JSONResponse(await asyncio.to_thread(manifest, folder))
        except FolderRefused as exc:
            return JSONResponse({"error": str(exc)}, status_code=403)

    async def one_file(request: Any) -> Any:
        try:
            folder = served_folder(roots, request.query_params.get("folder", ""))
        except FolderRefused as exc:
            return JSONResponse({"error": str(exc)}, status_code=403)
        path = folder / request.query_params.get("name", "")
        if path.parent != folder or not path.is_file() or path.is_symlink():
            return JSONResponse({"error": "no such file in that folder"}, status_code=404)
        return FileResponse(path, media_type="application/octet-stream")

    routes = [Route("/health", health), Route(MANIFEST, listed), Route(FILE, one_file)]
    return Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=key_guard(key))])


class MirrorError(RuntimeError):
    """A folder did not arrive whole: refused, cut short, or not what the manifest said."""


def target_folder(folder: str, roots: list[Path]) -> Path:
    """Where a mirror writes: ``folder`` itself, which must lie under one of ``roots``."""
    path = Path(folder).resolve()
    if not any(path.is_relative_to(r) for r in roots):
        raise FolderRefused(f"{folder} is not under a folder this server loads weights from (--weights-from)")
    return path


async def mirror(source: str, folder: str, roots: list[Path], key: str | None = None) -> dict[str, Any]:
    """``folder`` of the service at ``source`` into the same path here, file by file (a partial file
    never replaces a whole one), each checked by size and CRC-32; files it no longer holds removed."""
    import httpx

    start = time.perf_counter()
    target = target_folder(folder, roots)
    target.mkdir(parents=True, exist_ok=True)
    async with httpx.AsyncClient(base_url=source, headers=client_headers(key), timeout=600) as client:
        answer = await client.get(MANIFEST, params={"folder": folder})
        if answer.status_code != 200:
            raise MirrorError(
                f"{source} refused the manifest of {folder} ({answer.status_code}: {answer.text[:200]})"
            )
        files = answer.json()["files"]
        for entry in files:
            name = entry["name"]
            if "/" in name or name in ("", ".", ".."):
                raise MirrorError(f"{source} listed a file name that is not one: {name!r}")
            part = target / f".{name}.{os.getpid()}.part"  # engines sharing a disk each write their own
            crc, size = 0, 0
            async with client.stream("GET", FILE, params={"folder": folder, "name": name}) as resp:
                if resp.status_code != 200:
                    raise MirrorError(f"{source} refused {folder}/{name} ({resp.status_code})")
                with open(part, "wb") as out:
                    async for chunk in resp.aiter_raw(CHUNK):
                        crc, size = zlib.crc32(chunk, crc), size + len(chunk)
                        out.write(chunk)
            if (size, crc) != (entry["size"], entry["crc32"]):
                part.unlink(missing_ok=True)
                raise MirrorError(
                    f"{folder}/{name} arrived as {size} bytes, CRC-32 {crc:#010x}; the manifest says "
                    f"{entry['size']} bytes, {entry['crc32']:#010x}"
                )
            os.replace(part, target / name)
    kept = {e["name"] for e in files}
    for stale in (p for p in target.iterdir() if p.suffix in LOADED and p.is_file() and p.name not in kept):
        stale.unlink()
    total = sum(e["size"] for e in files)
    return {"files": len(files), "bytes": total, "seconds": round(time.perf_counter() - start, 3)}


def main() -> None:
    """``python -m rstar2.weight_transfer --root RUN``: the trainer's side (its key: ``$RSTAR2_API_KEY``)."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, action="append", required=True, help="A folder served (repeat).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    args = parser.parse_args()
    uvicorn.run(
        service_app(args.root, os.environ.get(KEY_ENV)), host=args.host, port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
