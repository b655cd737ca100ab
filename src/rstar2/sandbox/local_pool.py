"""The local pool: N pre-warmed workers behind one bounded queue, used in-process by rollouts. When
the queue is full, callers wait (backpressure) instead of piling up memory. Each call is answered
exactly once, including on shutdown."""

from __future__ import annotations

import asyncio
import itertools
import os
import zlib

from .defaults import SESSION_IDLE_S
from .isolation import IsolationConfig
from .request import ExecRequest, Limits
from .result import ExecResult
from .worker_handle import WorkerHandle


class PoolClosed(RuntimeError):
    pass


class LocalPool:
    def __init__(
        self,
        workers: int | None = None,
        limits: Limits | None = None,
        isolation: IsolationConfig | None = None,
        queue_size: int = 65536,
        preload: list[str] | None = None,
        max_sessions: int = 256,  # in all, shared out among the workers
        session_idle_s: float = SESSION_IDLE_S,
    ) -> None:
        self.size = workers or os.cpu_count() or 1
        self.limits = limits or Limits()
        self.isolation = isolation or IsolationConfig()
        self.queue_size = queue_size
        per_worker = max(1, -(-max_sessions // self.size))
        self.handles = [
            WorkerHandle(i, self.limits, self.isolation, preload, per_worker, session_idle_s)
            for i in range(self.size)
        ]
        self._queue: asyncio.PriorityQueue | None = None  # (0 handed back / 1 new, seq, call)
        self._seq = itertools.count()
        self._tasks: list[asyncio.Task] = []
        self._closed = False
        self.in_flight = 0

    async def start(self) -> LocalPool:
        if self._queue is not None:
            return self
        self._queue = asyncio.PriorityQueue(self.queue_size)
        await asyncio.gather(*(handle.start() for handle in self.handles))
        # `depth` takers per worker: the next call is already in the worker's pipe when one ends
        self._tasks = [
            asyncio.create_task(self._work(handle)) for handle in self.handles for _ in range(handle.depth)
        ]
        return self

    async def close(self) -> None:
        """Finish what is queued, then stop the workers."""
        if self._closed:
            return
        self._closed = True
        if self._queue is not None:
            await self._queue.join()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(handle.close() for handle in self.handles), return_exceptions=True)

    async def __aenter__(self) -> LocalPool:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    @property
    def layers(self) -> list[dict]:
        return list(self.handles[0].hello.get("layers", []))

    async def run(self, code: str | ExecRequest, input: str = "", **kw) -> ExecResult:
        req = code if isinstance(code, ExecRequest) else ExecRequest(code=code, input=input, **kw)
        if self._closed:
            raise PoolClosed("the sandbox pool is closed")
        if self._queue is None:
            await self.start()
        assert self._queue is not None
        if req.session_id:  # a session lives in one worker: go there directly
            handle = self.handles[zlib.crc32(req.session_id.encode()) % self.size]
            return await self._execute(handle, req)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        await self._queue.put((1, next(self._seq), (req, fut)))
        return await fut

    async def _execute(
        self, handle: WorkerHandle, req: ExecRequest, may_return: bool = False
    ) -> ExecResult | None:
        """The call's result; None (only with `may_return`) when it came back unstarted."""
        self.in_flight += 1
        try:
            return await handle.run(req, may_return)
        except Exception as exc:  # noqa: BLE001 - never lose a call
            return ExecResult.failure("internal", f"pool error: {exc!r}")
        finally:
            self.in_flight -= 1

    async def run_many(self, requests: list[ExecRequest | str]) -> list[ExecResult]:
        return list(await asyncio.gather(*(self.run(r) for r in requests)))

    async def _work(self, handle: WorkerHandle) -> None:
        assert self._queue is not None
        while True:
            _, _, item = await self._queue.get()
            req, fut = item
            try:
                if fut.done():  # the caller was cancelled while waiting
                    continue
                result = await self._execute(handle, req, may_return=True)
                if result is None:  # came back unstarted (behind a slow call, or a dead worker):
                    await self._queue.put((0, next(self._seq), item))  # first in line for any
                    await handle.running_call_ended()  # worker; this one takes no more meanwhile
                elif not fut.done():
                    fut.set_result(result)
            finally:
                self._queue.task_done()
