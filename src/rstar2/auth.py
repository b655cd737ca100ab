"""Who may call rstar2's services, and which folders they may load weights from. The services load
weights or run code, so a caller must show the API key (``--api-key``, else ``$RSTAR2_API_KEY``) as a
bearer token; only ``GET /health`` stays open (start-up waits poll it). A weight load is taken only
from under a ``--weights-from`` folder, so a key holder cannot make the server read the rest of the
disk. Imports only the standard library and Starlette: it also runs inside vLLM's API server."""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import json
import os
import secrets
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

KEY_ENV = "RSTAR2_API_KEY"
WEIGHTS_FROM_ENV = "RSTAR2_WEIGHTS_FROM"  # rstar2 vllm: --weights-from for its worker extension
OPEN_ROUTES_ENV = "RSTAR2_VLLM_OPEN_ROUTES"  # rstar2 vllm: --open-route, closed routes an operator opens
OPEN_PATHS = frozenset({"/health"})
# vLLM's routes a caller with the key may take: its APIs (/v1, /v2, /inference, ...), the other inference and
# information routes, and the development routes of rstar2's road (an in-place load through
# /collective_rpc's rstar2_load, the version, pausing around a load). Any other (/sleep, /wake_up,
# /weight_checker, /update_weights, ...: they change or free the weights outside rstar2's versioned
# loads, and a newer vLLM's routes too) answers 403 unless the operator opens it.
VLLM_OPEN = frozenset(
    {
        *("/health", "/ping", "/ready", "/readyz", "/metrics", "/version", "/load"),
        *("/docs", "/openapi.json", "/redoc", "/fault_tolerance/status", "/kv_event_sources"),
        *("/server_info", "/weight_info", "/is_sleeping", "/is_paused", "/get_world_size"),
        *("/tokenizer_info", "/tokenize", "/detokenize", "/invocations", "/pooling", "/classify"),
        *("/score", "/rerank"),
        *("/collective_rpc", "/pause", "/resume", "/update_weight_version", "/reset_prefix_cache"),
        "/mirror_weights",  # rstar2's own, behind this guard: a folder from the trainer (weight_transfer)
    }
)


VLLM_OPEN_UNDER = ("/v1/", "/v2/", "/inference/", "/cohere/", "/static/")  # its APIs, its docs' files


def vllm_route_open(path: str, opened: Iterable[str] = ()) -> bool:
    """Whether ``vllm_guard`` lets a key holder take ``path`` (a route without the root path)."""
    return path.startswith(VLLM_OPEN_UNDER) or path in VLLM_OPEN or path in {o for o in opened if o}


def route(request: Any) -> str:
    """The route a request asks for, without the server's root path (``--root-path /api``:
    ``/api/collective_rpc`` is ``/collective_rpc``) and without a trailing slash."""
    path, root = request.url.path, request.scope.get("root_path") or ""
    if root and path.startswith(root):
        path = path[len(root) :]
    return "/" + path.strip("/")


def service_key(given: str | None, host: str, what: str) -> tuple[str | None, str | None]:
    """The key service ``what`` requires (``--api-key``, else ``$RSTAR2_API_KEY``) and its warning."""
    key = given or os.environ.get(KEY_ENV) or None
    return key, exposed_warning(host, key, what)


def client_headers(key: str | None = None) -> dict[str, str]:
    """What rstar2's clients send: the bearer token of ``key`` (default ``$RSTAR2_API_KEY``)."""
    key = key or os.environ.get(KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def authorized(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``key`` as a bearer token (compared in constant
    time, over digests so that the length does not show either)."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return secrets.compare_digest(
        hashlib.sha256(token.encode()).digest(), hashlib.sha256(key.encode()).digest()
    )


Handler = Callable[[Any], Awaitable[Any]]


def key_guard(key: str | None) -> Callable[[Any, Handler], Awaitable[Any]]:
    """An HTTP middleware (``app.middleware("http")(key_guard(key))``) that answers 401 to every
    request but ``GET /health`` without ``key``; with no key it lets everything through."""
    from starlette.responses import JSONResponse

    async def guard(request: Any, call_next: Handler) -> Any:
        if (
            key
            and route(request) not in OPEN_PATHS
            and not authorized(request.headers.get("authorization"), key)
        ):
            return JSONResponse(
                {"error": "unauthorized: send the server's API key as 'Authorization: Bearer KEY'"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await call_next(request)

    return guard


_guard_for = functools.lru_cache(maxsize=4)(key_guard)  # vllm_guard: one guard a key, not one a request
RPC_ALLOWED = frozenset({"rstar2_load"})  # worker methods /collective_rpc may call on rstar2's vLLM


async def vllm_guard(request: Any, call_next: Handler) -> Any:
    """``key_guard`` on ``$RSTAR2_API_KEY`` inside vLLM's API server: unlike vLLM's ``--api-key`` (only
    ``/v1`` and ``/inference``) it also guards the routes that replace or relabel the weights;
    ``/collective_rpc`` may call only ``rstar2_load`` (vLLM's ``reload_weights`` would read any path),
    an adapter loads only from the ``--weights-from`` folders, and a route outside ``VLLM_OPEN``
    answers 403 unless opened (``rstar2 vllm --open-route``)."""
    from starlette.responses import JSONResponse

    path = route(request)
    if not vllm_route_open(path, os.environ.get(OPEN_ROUTES_ENV, "").split(",")):
        return JSONResponse(
            {
                "error": f"{path} is not a route of rstar2's road (it may change or free the weights "
                "served outside rstar2's versioned loads): closed; an operator opens it with "
                "rstar2 vllm --open-route"
            },
            status_code=403,
        )
    if path == "/v1/load_lora_adapter":
        try:
            lora = json.loads(await request.body() or b"{}").get("lora_path")
            roots = [Path(p) for p in os.environ.get(WEIGHTS_FROM_ENV, "").split(os.pathsep) if p]
            allowed_folder(str(lora), roots)
        except (ValueError, AttributeError, TypeError, FolderRefused) as exc:
            return JSONResponse({"error": f"/v1/load_lora_adapter: {exc}"}, status_code=403)
    if path == "/collective_rpc":
        try:
            method = json.loads(await request.body() or b"{}").get("method")
        except (ValueError, AttributeError):
            method = None
        if method not in RPC_ALLOWED:
            return JSONResponse(
                {"error": f"/collective_rpc may call only {sorted(RPC_ALLOWED)}"}, status_code=403
            )
    return await _guard_for(os.environ.get(KEY_ENV))(request, call_next)


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposed_warning(host: str, key: str | None, what: str) -> str | None:
    """The warning a service says at start on a non-loopback address: without a key, that anyone
    who reaches it can use it; the sandbox, key or not, that it runs untrusted code."""
    runs_code = "sandbox" in what
    if loopback(host):
        return None
    if key:
        return (
            f"warning: binding {host}: this service runs untrusted code; never expose it to a network "
            "you do not control"
            if runs_code
            else None
        )
    return (
        f"warning: {what} binds {host} without an API key: anyone who reaches this port can "
        f"{'run code on this machine' if runs_code else 'replace the weights it serves'}; "
        f"give --api-key (or ${KEY_ENV}) and the same key to its clients"
    )


def weights_roots(given: Iterable[str | Path]) -> list[Path]:
    """The folders weight loads may come from, resolved (a missing one is an error at start)."""
    roots = []
    for folder in given:
        path = Path(folder).expanduser()
        if not path.is_dir():
            raise ValueError(f"--weights-from {folder}: no such directory")
        roots.append(path.resolve())
    return roots


class FolderRefused(PermissionError):
    """A weight load from a folder outside those the server was started with."""


def allowed_folder(folder: str, roots: list[Path]) -> Path:
    """``folder`` resolved, when it and every file in it (what a load reads: the tensors, the
    configs) lie under one of ``roots``, symbolic links followed; else ``FolderRefused``, whose text
    does not say whether the path or a link's target exists."""
    if not roots:
        raise FolderRefused(
            "this server was started without --weights-from: it loads no weights (start it with "
            "--weights-from DIR, the folder the trainer writes its runs to)"
        )
    outside = f"{folder} is not under a folder this server loads weights from (--weights-from)"
    try:
        path = Path(folder).expanduser().resolve()
        root = next((r for r in roots if path.is_relative_to(r)), None)
        if root is None:
            raise FolderRefused(outside)
        for entry in _entries(path):
            if not entry.resolve().is_relative_to(root):
                raise FolderRefused(
                    f"{folder}: {entry.relative_to(path)} links to a file that is not under a folder this "
                    "server loads weights from (--weights-from); nothing was read"
                )
    except FolderRefused:
        raise
    except (OSError, RuntimeError) as exc:  # a link loop, a folder it may not list
        raise FolderRefused(f"{outside} ({type(exc).__name__})") from None
    return path


def _entries(folder: Path) -> list[Path]:
    """Every file and folder under ``folder``, links not followed (a load may read any of them)."""
    if not folder.is_dir():
        return []
    found = []
    for top, dirs, files in os.walk(folder):
        found += [Path(top) / name for name in (*dirs, *files)]
    return found
