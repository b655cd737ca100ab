"""Async client for the HTTP service. Concurrent calls are gathered into `/run_batch` requests
(up to `batch_size` calls, or whatever arrived within `linger_s`), like the paper's send workers.
Connection errors are retried with back-off for at least `retries` attempts and `retry_for_s` seconds.

    async with Client("http://127.0.0.1:8088") as client:
        result = await client.run("print(6 * 7)")
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field

import httpx

from ..auth import client_headers
from .defaults import PORT
from .request import ExecRequest
from .result import ExecResult


@dataclass(eq=False)
class Client:
    url: str = f"http://127.0.0.1:{PORT}"
    batch_size: int = 64
    linger_s: float = 0.002
    concurrency: int = 16
    retries: int = 4
    retry_for_s: float = 60.0
    request_timeout_s: float = 600.0
    api_key: str | None = field(default=None, repr=False)  # the service's (default: $RSTAR2_API_KEY)
    _queue: asyncio.Queue | None = field(default=None, init=False, repr=False)
    _senders: list[asyncio.Task] = field(default_factory=list, init=False, repr=False)
    _http: httpx.AsyncClient | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        if self._queue is not None:
            return
        self._queue = asyncio.Queue()
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        self._http = httpx.AsyncClient(
            timeout=self.request_timeout_s, limits=limits, headers=client_headers(self.api_key)
        )
        self._senders = [asyncio.create_task(self._sender()) for _ in range(self.concurrency)]

    async def close(self) -> None:
        for task in self._senders:
            task.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)
        self._senders = []
        if self._http is not None:
            await self._http.aclose()
        self._http = self._queue = None

    async def run(self, code: str | ExecRequest, input: str = "", **kw) -> ExecResult:
        req = code if isinstance(code, ExecRequest) else ExecRequest(code=code, input=input, **kw)
        if self._queue is None:
            await self.start()
        assert self._queue is not None
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        await self._queue.put((req, fut))
        return await fut

    async def run_many(self, requests: list[ExecRequest | str]) -> list[ExecResult]:
        return list(await asyncio.gather(*(self.run(r) for r in requests)))

    async def _sender(self) -> None:
        assert self._queue is not None
        while True:
            batch = await self._next_batch(self._queue)
            live = [(req, fut) for req, fut in batch if not fut.done()]
            if not live:
                continue
            results = await self._post([req for req, _ in live])
            if len(results) != len(live):  # never leave a caller waiting on a malformed reply
                results = [
                    ExecResult.failure("internal", "the service answered a batch with the wrong length")
                ] * len(live)
            for (_, fut), result in zip(live, results, strict=True):
                if not fut.done():
                    fut.set_result(result)

    async def _next_batch(self, queue: asyncio.Queue) -> list:
        """The first waiting call and whatever else arrives within `linger_s`, up to `batch_size`."""
        batch = [await queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.linger_s
        while len(batch) < self.batch_size:
            if not queue.empty():
                batch.append(queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return batch

    async def _post(self, reqs: list[ExecRequest]) -> list[ExecResult]:
        assert self._http is not None
        payload = {"requests": [{k: v for k, v in r.to_dict().items() if v is not None} for r in reqs]}
        last_error = ""
        give_up_at = time.monotonic() + self.retry_for_s
        for attempt in itertools.count(1):
            try:
                resp = await self._http.post(self.url + "/run_batch", json=payload)
                if resp.status_code == 200:
                    return [ExecResult.from_dict(d) for d in resp.json()["results"]]
                if 400 <= resp.status_code < 500:  # our request is wrong: retrying will not help
                    reason = f"rejected by the service ({resp.status_code}): {resp.text[:500]}"
                    if resp.status_code == 401:
                        reason += " (set $RSTAR2_API_KEY to the service's API key)"
                    return [ExecResult.failure("rejected", reason) for _ in reqs]
                last_error = f"HTTP {resp.status_code}"
            except (httpx.TransportError, ValueError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if attempt > self.retries and time.monotonic() >= give_up_at:
                break
            await asyncio.sleep(min(5.0, 0.25 * 2 ** min(attempt, 5)) * (0.5 + random.random()))
        return [ExecResult.failure("internal", f"sandbox service unreachable: {last_error}") for _ in reqs]
