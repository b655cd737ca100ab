"""A service started on this machine (`rstar2 sandbox serve`, `rstar2 serve`, `rstar2 vllm`): a free
port for it, its socket bound before it loads anything, and waiting until it answers ``GET /health``."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CannotListen(OSError):
    """A service's address is taken (or not this machine's): said before it loads anything."""


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (0: any free port), made before a service loads its
    model or workers: a port taken fails at once, naming it, not after minutes of loading; a
    client may connect meanwhile; and the address the service prints is read from this socket
    (``address``), never the one asked for."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not a port in use: one left in TIME_WAIT
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def address(sock: socket.socket) -> str:
    """The URL of what ``sock`` is bound to."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def wait_healthy(
    url: str,
    proc: subprocess.Popen | None = None,
    timeout_s: float = 120.0,
    what: str = "service",
    detail: Callable[[], str] = lambda: "",
) -> None:
    """Return once ``url`` answers ``/health`` with 200; raise if ``proc`` exits first or
    ``timeout_s`` passes (``detail()`` ends the message: a log's tail, the process's stderr)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} at {url} exited during start-up{detail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} at {url} did not answer within {timeout_s:.0f} s{detail()}")
        if healthy(url):
            return
        time.sleep(0.2)


def healthy(url: str) -> bool:
    """Whether ``url`` answers ``GET /health`` with 200 now."""
    import httpx

    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
