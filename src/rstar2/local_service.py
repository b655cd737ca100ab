"""A service started on this machine (`rstar2 sandbox serve`, `rstar2 serve`, `rstar2 vllm`): a free
port for it, and waiting until it answers ``GET /health``."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(
    url: str,
    proc: subprocess.Popen | None = None,
    timeout_s: float = 120.0,
    what: str = "service",
    detail: Callable[[], str] = lambda: "",
) -> None:
    """Return once ``url`` answers ``/health`` with 200; raise if ``proc`` exits first or
    ``timeout_s`` passes (``detail()`` ends the message: a log's tail, the process's stderr)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} at {url} exited during start-up{detail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} at {url} did not answer within {timeout_s:.0f} s{detail()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
