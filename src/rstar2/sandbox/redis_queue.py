"""Distributed mode: calls go through a Redis stream to worker nodes (`rstar2 sandbox worker`).

Delivery is at least once, results exactly once:

- `RedisBackend` (in `serve --redis URL`) XADDs each call to the stream ``rstar2:sandbox:tasks`` and
  keeps its request until the reply arrives on its own list ``rstar2:sandbox:replies:{backend id}``;
  duplicate replies (a task run twice) are dropped by call id.
- `RedisWorker` reads tasks through the consumer group ``workers``, runs them in a `LocalPool`, pushes
  the reply, then acknowledges. Every worker also reclaims (XAUTOCLAIM) tasks another consumer has
  held past the lease: the task of a worker that died is delivered again.
- Every call has a deadline; past it the caller gets status ``internal`` with the reason. A task
  delivered more than `MAX_DELIVERIES` times (it kills every worker that takes it) gets ``internal``
  too, instead of being retried forever.
- Redis restarts: both sides reconnect with back-off. A restart without persistence loses the stream,
  so the backend re-submits every call it is still waiting for; callers see extra latency, not loss.
- Whoever reaches the Redis server runs code on every worker and can forge tool results: both sides
  authenticate (``redis://:PASSWORD@host``, else ``$RSTAR2_REDIS_PASSWORD``; ``rediss://`` for TLS)
  and warn when a routable server is used without a password. A refused password is no outage: it
  stops the worker, and fails the backend's calls, with the server's words.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.exceptions import (
    AuthenticationError,
    InvalidResponse,
    NoPermissionError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..auth import loopback
from .defaults import DEADLINE_S, LEASE_S
from .local_pool import LocalPool
from .request import ExecRequest
from .result import ExecResult

log = logging.getLogger("rstar2.sandbox.redis")
PREFIX = "rstar2:sandbox"  # of every key, both sides
TASKS = f"{PREFIX}:tasks"  # the stream of calls
GROUP = "workers"
_CONN_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
_REFUSED = (AuthenticationError, NoPermissionError)  # a password or an ACL refused: no outage to wait out
PASSWORD_ENV = "RSTAR2_REDIS_PASSWORD"


class RedisRefused(RuntimeError):
    """The Redis server refused this client's password (or its user's rights)."""


def _password(url: str) -> str | None:
    """The URL's password, else ``$RSTAR2_REDIS_PASSWORD`` (kept out of ``ps`` and shell history)."""
    return urlsplit(url).password or os.environ.get(PASSWORD_ENV) or None


def shown(url: str) -> str:
    """``url`` without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


def exposed_warning(url: str) -> str | None:
    """The warning for a Redis server on a routable address used without a password."""
    host = urlsplit(url).hostname or ""
    if not host or loopback(host) or _password(url):  # no host: a Unix socket, this machine's
        return None
    return (
        f"warning: Redis at {host} has no password: whoever reaches it runs code on every sandbox worker "
        f"and can forge tool results; start redis-server with --requirepass and give "
        f"redis://:PASSWORD@{host}:PORT (or ${PASSWORD_ENV}); rediss:// adds TLS"
    )


def refused(url: str, exc: BaseException) -> RedisRefused:
    return RedisRefused(
        f"Redis at {shown(url)} refused this client ({exc}): give its password as "
        f"redis://:PASSWORD@HOST:PORT or ${PASSWORD_ENV}"
    )


def _client(url: str) -> aioredis.Redis:
    """A client whose pool makes callers wait for a free connection instead of failing."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=5,
        max_connections=32,
        timeout=None,
        password=_password(url),  # the URL's own, when it has one, takes precedence in redis-py
    )
    return aioredis.Redis(connection_pool=pool)


class RedisBackend:
    """The service side: enqueue calls, collect replies, re-submit after a Redis restart."""

    STREAM_MAXLEN = 1_000_000  # the stream is trimmed (approximately) to this many calls

    def __init__(self, url: str, deadline_s: float = DEADLINE_S) -> None:
        self.url, self.deadline_s = url, deadline_s
        self.id = uuid.uuid4().hex[:12]
        self.reply_key = f"{PREFIX}:replies:{self.id}"
        self._redis: aioredis.Redis | None = None
        self._listener: asyncio.Task | None = None
        self._pending: dict[str, tuple[dict, asyncio.Future]] = {}
        self.resubmitted = self.duplicates = 0
        self._closing = False
        self._run_id: str | None = None  # the Redis server instance the pending calls went to

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    in_flight = queue_depth  # one number here: the calls waiting for a result, queued or running

    async def start(self) -> RedisBackend:
        if self._redis is None:
            self._redis = _client(self.url)
            self._listener = asyncio.create_task(self._listen())
        return self

    async def close(self) -> None:
        self._closing = True
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.wait([self._listener], timeout=5)  # never hang on a stuck connection
        for _, fut in self._pending.values():
            if not fut.done():
                fut.set_result(ExecResult.failure("internal", "sandbox service shutting down"))
        if self._redis is not None:
            with contextlib.suppress(RedisError, OSError, asyncio.TimeoutError):
                await asyncio.wait_for(self._redis.delete(self.reply_key), 5)
                await asyncio.wait_for(self._redis.aclose(), 5)
        self._redis = None

    async def run(self, req: ExecRequest) -> ExecResult:
        if req.session_id:
            return ExecResult.failure(
                "rejected", "stateful sessions are served by the local pool only, not in Redis mode"
            )
        await self.start()
        call_id = uuid.uuid4().hex
        deadline = time.time() + self.deadline_s
        task = {
            "id": call_id,
            "reply": self.reply_key,
            "deadline": deadline,
            "req": json.dumps(req.to_dict()),
        }
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[call_id] = (task, fut)

        async def submit_and_wait() -> ExecResult:
            await self._submit(task)
            return await asyncio.shield(fut)

        try:  # the deadline bounds everything, a Redis that hangs included
            return await asyncio.wait_for(submit_and_wait(), max(0.0, deadline - time.time()))
        except asyncio.TimeoutError:
            return ExecResult.failure(
                "internal", f"no result within the call's deadline of {self.deadline_s:g} s"
            )
        finally:
            self._pending.pop(call_id, None)

    async def _submit(self, task: dict) -> None:
        delay = 0.1
        while True:
            try:
                await self._enqueue(task)
                return
            except _REFUSED as exc:  # not an outage: this call fails with the server's words
                fut = self._pending.get(task["id"], (None, None))[1]
                if fut is not None and not fut.done():
                    fut.set_result(ExecResult.failure("internal", str(refused(self.url, exc))))
                return
            except _CONN_ERRORS:
                if time.time() > task["deadline"]:
                    return  # run() reports the deadline
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)

    async def _enqueue(self, task: dict) -> None:
        assert self._redis is not None
        await self._redis.xadd(TASKS, task, maxlen=self.STREAM_MAXLEN, approximate=True)

    async def _listen(self) -> None:
        """Collect replies; re-submit every call still waiting when Redis itself restarted (a connection
        that merely timed out finds the same server, whose stream still holds the calls: re-submitting
        them then would only run them twice)."""
        delay = 0.1
        lost = False
        while not self._closing:
            try:
                assert self._redis is not None
                if lost or self._run_id is None:
                    run_id = (await self._redis.info("server"))["run_id"]
                    if lost and run_id != self._run_id:  # a new server: the queued calls are gone
                        for task, fut in list(self._pending.values()):
                            if not fut.done():
                                self.resubmitted += 1
                                await self._enqueue(task)
                    self._run_id = run_id
                    lost = False
                    delay = 0.1
                item = await self._redis.blpop([self.reply_key], timeout=1)
                if item is None:
                    continue
                reply = json.loads(item[1])
                entry = self._pending.get(reply["id"])
                if entry is None or entry[1].done():
                    self.duplicates += 1
                    continue
                entry[1].set_result(ExecResult.from_dict(reply["result"]))
            except _REFUSED as exc:  # every waiting call fails, said; the service goes on serving
                why = str(refused(self.url, exc))
                if delay < 2.0:  # said once a back-off, not at every retry
                    log.error("%s", why)
                for _, fut in list(self._pending.values()):
                    if not fut.done():
                        fut.set_result(ExecResult.failure("internal", why))
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
            except _CONN_ERRORS as exc:
                if not lost:
                    log.warning("lost Redis at %s (%s); reconnecting", shown(self.url), exc)
                lost = True
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)


class RedisWorker:
    """A worker node: takes tasks from the stream, runs them in a local pool, replies, acknowledges."""

    MAX_DELIVERIES = 3
    REPLY_TTL_S = 3600  # a reply list nobody reads (its backend is gone) is dropped after this

    def __init__(self, url: str, pool: LocalPool, lease_s: float = LEASE_S, name: str | None = None) -> None:
        self.url, self.pool, self.lease_s = url, pool, lease_s
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.slots = asyncio.Semaphore(pool.size * 2)
        self._redis = _client(url)  # connects on first use
        self._tasks: set[asyncio.Task] = set()
        self._running: set[str] = set()  # stream entries being executed on this node
        self._stop = asyncio.Event()

    async def _ensure_group(self) -> None:
        try:
            await self._redis.xgroup_create(TASKS, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        await self.pool.start()
        heartbeat = asyncio.create_task(self._heartbeat())
        delay = 0.1
        reclaim_at = 0.0
        try:
            while not self._stop.is_set():
                try:
                    await self._ensure_group()
                    while not self._stop.is_set():
                        await self.slots.acquire()
                        self.slots.release()
                        free = self.slots._value  # noqa: SLF001 - how many tasks this node can start now
                        if time.monotonic() >= reclaim_at:
                            reclaim_at = time.monotonic() + max(0.5, self.lease_s / 4)
                            await self._reclaim(free)
                            free = self.slots._value  # noqa: SLF001
                            if free <= 0:
                                continue
                        resp = await self._redis.xreadgroup(
                            GROUP, self.name, {TASKS: ">"}, count=max(1, free), block=1000
                        )
                        for _, entries in resp or []:
                            for entry_id, fields in entries:
                                await self._start(entry_id, fields, deliveries=1)
                        delay = 0.1
                except _REFUSED as exc:  # retrying would never succeed: the worker stops, saying why
                    raise refused(self.url, exc) from None
                except InvalidResponse as exc:  # another protocol (an HTTP port): neither would it
                    raise RedisRefused(f"{shown(self.url)} is not a Redis server: {exc}") from None
                except _CONN_ERRORS as exc:
                    log.warning("Redis unavailable at %s (%s); retrying", shown(self.url), exc)
                    await asyncio.sleep(delay)
                    delay = min(2.0, delay * 2)
                except ResponseError as exc:  # e.g. NOGROUP after a restart without persistence
                    log.warning("Redis error (%s); re-creating the consumer group", exc)
                    await asyncio.sleep(delay)
        finally:
            heartbeat.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._redis.aclose()
            await self.pool.close()

    async def _heartbeat(self) -> None:
        """Renew the lease of the tasks held here (running or queued in the pool) every third of the
        lease, independently of the read loop, so a long call is not handed to another node."""
        while not self._stop.is_set():
            await asyncio.sleep(max(0.1, self.lease_s / 3))
            if not self._running:
                continue
            try:
                await self._redis.xclaim(
                    TASKS, GROUP, self.name, min_idle_time=0, message_ids=list(self._running), justid=True
                )
            except (*_CONN_ERRORS, ResponseError) as exc:
                log.warning("could not renew leases (%s)", exc)

    async def _reclaim(self, free: int) -> None:
        """Take over tasks whose worker has held them past the lease (it died or hangs)."""
        lease_ms = int(self.lease_s * 1000)
        _, claimed, *_ = await self._redis.xautoclaim(
            TASKS, GROUP, self.name, min_idle_time=lease_ms, start_id="0-0", count=free
        )
        ids = [entry_id for entry_id, fields in claimed if fields]
        counts: dict[str, int] = {}
        if ids:
            info = await self._redis.xpending_range(TASKS, GROUP, min=ids[0], max=ids[-1], count=len(ids) * 4)
            counts = {row["message_id"]: int(row["times_delivered"]) for row in info}
        for entry_id, fields in claimed:
            if not fields:  # trimmed from the stream meanwhile
                await self._redis.xack(TASKS, GROUP, entry_id)
                continue
            await self._start(entry_id, fields, deliveries=counts.get(entry_id, 2))

    async def _start(self, entry_id: str, fields: dict, deliveries: int) -> None:
        await self.slots.acquire()
        task = asyncio.create_task(self._handle(entry_id, fields, deliveries))
        self._tasks.add(task)
        self._running.add(entry_id)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _t: self._running.discard(entry_id))

    async def _handle(self, entry_id: str, fields: dict, deliveries: int) -> None:
        try:
            if float(fields.get("deadline", 0)) and time.time() > float(fields["deadline"]):
                result = ExecResult.failure("internal", "the call's deadline passed while it was queued")
            elif deliveries > self.MAX_DELIVERIES:
                result = ExecResult.failure(
                    "internal", f"task was delivered {deliveries} times and never finished; given up"
                )
            else:
                result = await self.pool.run(ExecRequest.from_dict(json.loads(fields["req"])))
            reply = json.dumps({"id": fields["id"], "result": result.to_dict()})
            await self._reply(fields["reply"], reply, entry_id)
        finally:
            self.slots.release()

    async def _reply(self, key: str, reply: str, entry_id: str) -> None:
        delay = 0.1
        for _ in range(30):
            try:
                async with self._redis.pipeline(transaction=True) as pipe:
                    pipe.rpush(key, reply)
                    pipe.expire(key, self.REPLY_TTL_S)
                    pipe.xack(TASKS, GROUP, entry_id)
                    pipe.xdel(TASKS, entry_id)
                    await pipe.execute()
                return
            except _CONN_ERRORS:
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
        log.error("could not deliver the result of %s; it will be re-run after the lease", entry_id)
