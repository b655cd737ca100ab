"""Who may call rstar2's services, and which folders they may load weights from. The services load
weights or run code, so a caller must show the API key (``--api-key``, else ``$RSTAR2_API_KEY``) as a
bearer token; only ``GET /health`` stays open (start-up waits poll it). A weight load is taken only
from under a ``--weights-from`` folder, so a key holder cannot make the server read the rest of the
disk. Imports only the standard library and Starlette: it also runs inside vLLM's API server."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

KEY_ENV = "RSTAR2_API_KEY"
WEIGHTS_FROM_ENV = "RSTAR2_WEIGHTS_FROM"  # rstar2 vllm: --weights-from for its worker extension
FETCH_FROM_ENV = "RSTAR2_FETCH_FROM"  # rstar2 vllm: --fetch-from, for /mirror_weights inside vLLM
OPEN_ROUTES_ENV = "RSTAR2_VLLM_OPEN_ROUTES"  # rstar2 vllm: --open-route, closed routes an operator opens
OPEN_PATHS = frozenset({"/health"})
# vLLM's routes a caller with the key may take: its APIs (/v1, /v2, /inference, ...), the other inference and
# information routes, the development routes of rstar2's road (an in-place load through /collective_rpc's
# rstar2_load, the version, pausing around a load), and rstar2's own /mirror_weights (weight_transfer). Any
# other (/sleep, /wake_up, /weight_checker, /update_weights, ...: they change or free the weights outside
# rstar2's versioned loads, and a newer vLLM's routes too) answers 403 unless the operator opens it.
VLLM_OPEN = frozenset(
    """/health /ping /ready /readyz /metrics /version /load /docs /openapi.json /redoc
    /fault_tolerance/status /kv_event_sources /server_info /weight_info /is_sleeping /is_paused
    /get_world_size /tokenizer_info /tokenize /detokenize /invocations /pooling /classify /score /rerank
    /collective_rpc /pause /resume /update_weight_version /reset_prefix_cache /mirror_weights""".split()
)

VLLM_OPEN_UNDER = ("/v1/", "/v2/", "/inference/", "/cohere/", "/static/")  # its APIs, its docs' files


def route(request: Any) -> str:
    """The route a request asks for, without the server's root path (``--root-path /api``:
    ``/api/collective_rpc`` is ``/collective_rpc``) and without a trailing slash."""
    return "/" + request.url.path.removeprefix(request.scope.get("root_path") or "").strip("/")


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
        header = request.headers.get("authorization")
        if key and route(request) not in OPEN_PATHS and not authorized(header, key):
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

    def refused(error: str) -> Any:
        return JSONResponse({"error": error}, status_code=403)

    path = route(request)
    opened = {o for o in os.environ.get(OPEN_ROUTES_ENV, "").split(",") if o}
    if not (path.startswith(VLLM_OPEN_UNDER) or path in VLLM_OPEN or path in opened):
        return refused(
            f"{path} is not a route of rstar2's road (it may change or free the weights served outside "
            "rstar2's versioned loads): closed; an operator opens it with rstar2 vllm --open-route"
        )
    if path == "/v1/load_lora_adapter":
        try:
            body = json.loads(await request.body() or b"{}")
            if body.get("load_inplace") not in (None, False):
                raise FolderRefused(
                    "load_inplace is refused: it would swap the weights under a name rstar2 has mapped to "
                    "one policy version (tokens sampled after would be trained as that version); load "
                    "the adapter under a new name"
                )
            if not isinstance(body.get("lora_path"), str):
                raise TypeError("give lora_path, a folder under --weights-from")
            roots = [Path(p) for p in os.environ.get(WEIGHTS_FROM_ENV, "").split(os.pathsep) if p]
            # vLLM is handed the folder checked, by its absolute path: a relative one it would look
            # for in its working folder, then fetch from the Hugging Face Hub
            body["lora_path"] = str(allowed_folder(body["lora_path"], roots))
            request._body = json.dumps(body).encode()  # what the route reads (Starlette's cached body)
        except (ValueError, AttributeError, TypeError, FolderRefused) as exc:
            return refused(f"/v1/load_lora_adapter: {exc}")
    if path == "/collective_rpc":
        try:
            method = json.loads(await request.body() or b"{}").get("method")
        except (ValueError, AttributeError):
            method = None
        if method not in RPC_ALLOWED:
            return refused(f"/collective_rpc may call only {sorted(RPC_ALLOWED)}")
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
    if loopback(host) or (key and not runs_code):
        return None
    if key:
        return (
            f"warning: binding {host}: this service runs untrusted code; never expose it to a network "
            "you do not control"
        )
    return (
        f"warning: {what} binds {host} without an API key: anyone who reaches this port can "
        f"{'run code on this machine' if runs_code else 'replace the weights it serves'}; "
        f"give --api-key (or ${KEY_ENV}) and the same key to its clients"
    )


class FolderRefused(PermissionError):
    """A weight load from a folder outside those the server was started with."""


def allowed_folder(folder: str, roots: list[Path]) -> Path:
    """``folder`` resolved, when it is a folder that, with every file and folder in it (what a load
    may read), lies under one of ``roots``, symbolic links followed; else ``FolderRefused``, whose
    text does not say whether the path or a link's target exists. A relative path is taken under
    each root in turn, never under the server's working folder (nor as a name vLLM would fetch from
    the Hugging Face Hub). A file with more than one hard link is refused: its other names may lie
    anywhere and no path tells where (the trainer and a mirror write fresh files, with one link; a
    folder of hard-linked copies, ``cp -al`` or a deduplicating tool's, must be copied). A load then
    reads what it opens, checked again on the open file (``opened_folder``)."""
    if not roots:
        raise FolderRefused(
            "this server was started without --weights-from: it loads no weights (start it with "
            "--weights-from DIR, the folder the trainer writes its runs to)"
        )
    outside = f"{folder} is not under a folder this server loads weights from (--weights-from)"
    try:
        given = Path(folder).expanduser()
        for candidate in [given] if given.is_absolute() else [r / given for r in roots]:
            path = candidate.resolve()
            root = next((r for r in roots if path.is_relative_to(r)), None)
            if root is not None and path.is_dir():
                break
        else:
            raise FolderRefused(outside)
        for top, dirs, files in os.walk(path):  # links not followed: a load may read any of these
            for entry in (Path(top) / name for name in (*dirs, *files)):
                target = entry.resolve()
                if not target.is_relative_to(root):
                    raise FolderRefused(
                        f"{folder}: {entry.relative_to(path)} links to a file that is not under a folder "
                        "this server loads weights from (--weights-from); nothing was read"
                    )
                if target.is_file() and target.stat().st_nlink > 1:
                    raise FolderRefused(f"{folder}: {entry.relative_to(path)}: {HARD_LINKED}")
    except FolderRefused:
        raise
    except (OSError, RuntimeError) as exc:  # a link loop, a folder it may not list
        raise FolderRefused(f"{outside} ({type(exc).__name__})") from None
    return path


HARD_LINKED = (
    "a file with other hard links, which may lie outside the --weights-from folders (no path tells): "
    "refused, nothing was read; copy it to a file of its own"
)


def open_under(path: Path, roots: list[Path]) -> int:
    """A read-only descriptor of the file ``path`` names, opened as a load reads it: its resolved
    path taken from its root down one name at a time, no link followed (a name made a link since
    ``allowed_folder`` looked fails the open), then checked on the open file: a regular file with
    no other hard link. What is read through it is the file checked, whatever the path names next."""
    real = Path(path).resolve()
    root = next((r for r in roots if real.is_relative_to(r) and real != r), None)
    changed = FolderRefused(
        f"{path} is not under a folder this server loads weights from (--weights-from), or changed "
        "while it was opened; nothing was read"
    )
    if root is None:
        raise changed
    *folders, name = real.relative_to(root).parts
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise changed from None
    try:
        for part in folders:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = inner
        # not blocking: a FIFO planted there is refused below, not waited on
        file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        raise changed from None
    finally:
        os.close(fd)
    st = os.fstat(file)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:  # 0: removed since it was opened, read as opened
        os.close(file)
        raise FolderRefused(f"{path}: {HARD_LINKED}" if stat.S_ISREG(st.st_mode) else changed.args[0])
    return file


@contextlib.contextmanager
def opened_folder(folder: Path, roots: list[Path]) -> Iterator[Path]:
    """A private folder standing for ``folder`` (checked by ``allowed_folder``) while a load reads it:
    each of its files opened once (``open_under``) and linked there as ``/proc/self/fd/N``, so a
    library handed a folder (safetensors, PEFT, vLLM's loader, all in this process) reads the files
    checked, not what the path names by the time it reads. Its sub-folders are left out: a load
    reads a folder's own files (an adapter's ``base/`` is a folder of its own). Linux's ``/proc``."""
    private = Path(tempfile.mkdtemp(prefix="rstar2-load-"))
    opened: list[int] = []
    try:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            raise FolderRefused(f"{folder} changed while it was opened; nothing was read") from None
        for name in names:
            if (folder / name).is_file():
                opened.append(open_under(folder / name, roots))
                (private / name).symlink_to(f"/proc/self/fd/{opened[-1]}")
        yield private
    finally:
        for fd in opened:
            os.close(fd)
        shutil.rmtree(private, ignore_errors=True)


def umask() -> int:
    """This process's umask, read without changing it (``os.umask`` sets it, for every thread)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(folder: Path) -> None:
    """``folder``'s own files given the mode any file this process creates gets, 0o666 less the
    umask (0o644 under the usual 022, 0o640 under 027): safetensors (0.7 on) writes through a
    private temporary file, mode 0o600, which a server running as another user on a shared
    filesystem could not read. The umask the trainer starts with decides who reads its weights."""
    mode = 0o666 & ~umask()
    for entry in folder.iterdir():
        if entry.is_file() and not entry.is_symlink():
            entry.chmod(mode)
