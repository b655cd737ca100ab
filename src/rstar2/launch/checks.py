"""The checks a launch makes before the first step, each with a deadline and an error naming what
failed, where, and which log says more: never a hang. Ports free, the head's Redis taking the
launch's password (and refusing a client without it), the run folder shared (a canary), every node
joined, every service answering from the trainer's node, taking the key and refusing a stranger."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from ..auth import client_headers

POLL_S = 0.5


class NodeError(RuntimeError):
    """A launch failed on a node: which check, which role, where its log is."""


def deadline(what: str, seconds: float, check: Callable[[], Any], why: Callable[[], str] = lambda: "") -> Any:
    """``check()``'s first truthy answer, polled; a ``NodeError`` naming ``what`` after ``seconds``."""
    end = time.monotonic() + seconds
    while not (found := check()):
        if time.monotonic() > end:
            raise NodeError(f"{what} within {seconds:.0f} s{why()}")
        time.sleep(POLL_S)
    return found


def ports_free(host: str, ports: dict[int, str], where: str) -> None:
    """Each port binds as its server will bind it (a port in TIME_WAIT is nobody's)."""
    for port, role in ports.items():
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                s.listen()
            except OSError as exc:
                raise NodeError(
                    f"{where}: port {port} for its {role} is taken ({exc.strerror}): stop what holds it, "
                    "or move the band (cluster.port_base)"
                ) from None


def redis_client(host: str, port: int, password: str, seconds: float, where: str) -> Any:
    """The head's Redis, reached with ``password``, refusing a client without it."""
    import redis

    def answered(password: str | None) -> Any:
        client = redis.Redis(host, port, password=password, socket_timeout=5)
        try:
            client.ping()
            return client
        except (redis.AuthenticationError, redis.ResponseError) as exc:
            return exc  # a refusal (NOAUTH, a wrong password) is an answer
        except redis.ConnectionError:
            return None

    found = deadline(
        f"{where}: the head's Redis at {host}:{port} did not answer", seconds, lambda: answered(password)
    )
    if isinstance(found, Exception):
        raise NodeError(f"{where}: the head's Redis refused the launch's password: {found}")
    if not isinstance(answered(None), Exception):
        raise NodeError(f"{where}: the head's Redis at {host}:{port} answers without a password")
    return found


def services_answer(services: list[tuple[str, str, Callable[[dict[str, str]], Any]]], where: str) -> None:
    """Each (what, url, ask) answers ``ask`` from here: 200 with the key, 401 without it."""
    import httpx

    for what, url, ask in services:
        try:
            stranger, keyed = ask({}), ask(client_headers())  # the launch's key, from this node's environment
        except httpx.HTTPError as exc:
            raise NodeError(f"{where}: {what} at {url} cannot be reached from the head: {exc}") from None
        if stranger.status_code != 401:
            raise NodeError(
                f"{where}: {what} at {url} answers a caller without the key ({stranger.status_code})"
            )
        if keyed.status_code != 200:
            said = f"{keyed.status_code}: {keyed.text[:200]}"
            raise NodeError(f"{where}: {what} at {url} refused the launch's key ({said})")
