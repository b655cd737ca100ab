"""The parent side of one pre-warmed worker: starts it, sends it calls, restarts it when it dies.

Calls are pipelined: up to `depth` are outstanding per worker, so the next request already waits in
its pipe when a call ends and the worker never idles on this process's round trip (one queued behind
a long call comes back unstarted: `inbox.Inbox`). One reader task matches answers to calls. The
worker enforces the wall-clock limit; this side's backstop kills and replaces a worker silent past
the running call's timeout plus a grace period. When a worker dies, its running call gets status
``internal``; the calls queued behind it never started and go again, to whichever worker is free.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from .cgroups import remove_cgroups
from .defaults import SESSION_IDLE_S, SESSIONS_PER_WORKER
from .framing import encode, read_msg
from .isolation import IsolationConfig
from .request import ExecRequest, Limits
from .result import ExecResult

_GRACE_S = 60.0  # on top of a call's timeout: the kernel tearing down a big process tree can be slow
_START_TIMEOUT_S = 120.0
_INHERITED_ENV = ("PATH", "PYTHONPATH", "LANG", "VIRTUAL_ENV", "RSTAR2_HUGE_PAGES")
_UNSTARTED = object()  # the answer for a queued call handed back, or whose worker died before it


class WorkerDied(RuntimeError):
    pass


@dataclass
class _Call:
    id: int
    timeout_s: float
    future: asyncio.Future
    timer: asyncio.TimerHandle | None = None


@dataclass
class _WorkerProcess:
    """One worker process with its own queue of calls sent to it (a replacement gets a new one)."""

    proc: asyncio.subprocess.Process
    hello: dict
    pending: dict[int, _Call] = field(default_factory=dict)  # sent, not answered, in the order sent
    reader: asyncio.Task | None = None
    lost: bool = False


@dataclass(eq=False)
class WorkerHandle:
    depth = 2  # calls outstanding at once (see above)

    index: int
    limits: Limits
    isolation: IsolationConfig
    preload: list[str] | None = None
    max_sessions: int = SESSIONS_PER_WORKER
    session_idle_s: float = SESSION_IDLE_S
    hello: dict = field(default_factory=dict, init=False)
    restarts: int = field(default=0, init=False)
    _ids: Iterator[int] = field(default_factory=itertools.count, init=False, repr=False)
    _start_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    _current: _WorkerProcess | None = field(default=None, init=False, repr=False)

    @property
    def proc(self) -> asyncio.subprocess.Process | None:
        """The live worker process, if any."""
        worker = self._current
        return worker.proc if worker is not None and not worker.lost else None

    async def start(self) -> None:
        async with self._start_lock:
            if self.proc is None:
                await self._spawn()

    async def _spawn(self) -> None:
        cfg = {
            "index": self.index,
            "isolation": asdict(self.isolation),
            "limits": self.limits.to_dict(),
            "max_sessions": self.max_sessions,
            "session_idle_s": self.session_idle_s,
        }
        if self.preload is not None:
            cfg["preload"] = list(self.preload)
        env = {k: v for k, v in os.environ.items() if k in _INHERITED_ENV}
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        args, pipe = (sys.executable, "-m", "rstar2.sandbox.worker", json.dumps(cfg)), asyncio.subprocess.PIPE
        proc = await asyncio.create_subprocess_exec(*args, stdin=pipe, stdout=pipe, env=env, limit=1 << 26)
        try:
            hello = await asyncio.wait_for(self._recv(proc), _START_TIMEOUT_S)
        except (asyncio.TimeoutError, WorkerDied) as exc:
            await self._kill(proc, {})
            raise RuntimeError(f"sandbox worker {self.index} failed to start: {exc!r}") from exc
        self.hello = hello
        worker = self._current = _WorkerProcess(proc, hello)
        worker.reader = asyncio.create_task(self._read_answers(worker))

    async def close(self) -> None:
        worker, self._current = self._current, None
        if worker is None:
            return
        worker.lost = True  # closing: its end is no loss
        proc = worker.proc
        if proc.returncode is None:
            with contextlib.suppress(Exception):
                self._send(proc, {"op": "exit"})
                await asyncio.wait_for(proc.wait(), 5)
        if worker.reader is not None:
            worker.reader.cancel()
            await asyncio.gather(worker.reader, return_exceptions=True)
        await self._kill(proc, worker.hello)

    @staticmethod
    async def _kill(proc: asyncio.subprocess.Process, hello: dict) -> None:
        """End a worker process and remove what it leaves on the host (its cgroup, its root dir)."""
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if hello.get("cgroup"):
            remove_cgroups(hello["cgroup"])
        if hello.get("root_dir"):
            with contextlib.suppress(OSError):
                os.rmdir(hello["root_dir"])

    async def run(self, req: ExecRequest, may_return: bool = False) -> ExecResult | None:
        """Run one call. With `may_return`, None means the call came back unstarted (queued behind a
        slow one, or behind one whose worker died): the caller should give it to another worker.
        Without, it is sent again here."""
        limits = self.limits.merged(req.timeout_s, req.memory_mb)
        msg = {
            "op": "run",
            "code": req.code,
            "input": req.input,
            "session_id": req.session_id,
            "limits": {"timeout_s": limits.timeout_s, "memory_mb": limits.memory_mb},
        }
        while True:
            try:
                await self.start()
            except RuntimeError as exc:
                return ExecResult.failure("internal", str(exc))
            worker = self._current
            assert worker is not None
            call = _Call(next(self._ids), limits.timeout_s, asyncio.get_running_loop().create_future())
            msg["id"] = call.id
            worker.pending[call.id] = call
            if len(worker.pending) == 1:
                self._arm(call, worker.proc)
            with contextlib.suppress(OSError):  # the reader finds the worker dead and answers this call
                self._send(worker.proc, msg)
            # A caller that gives up leaves the call to finish; its answer is then dropped.
            answer = await asyncio.shield(call.future)
            if answer is not _UNSTARTED:
                return answer
            if may_return:
                return None

    async def running_call_ended(self) -> None:
        """Wait until the call the worker is running now has ended (or the worker is gone)."""
        worker = self._current
        head = next(iter(worker.pending.values()), None) if worker is not None else None
        if head is not None:
            await asyncio.wait([head.future])

    def _arm(self, call: _Call, proc: asyncio.subprocess.Process) -> None:
        """The backstop for the call now running: kill the worker if it overruns."""
        loop = asyncio.get_running_loop()
        call.timer = loop.call_later(call.timeout_s + _GRACE_S, self._overdue, proc)

    @staticmethod
    def _overdue(proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            proc.overdue = True  # type: ignore[attr-defined]
            proc.kill()

    async def _read_answers(self, worker: _WorkerProcess) -> None:
        """Match the worker's answers to the pending calls, until the worker is gone. The oldest
        pending call is the one running; calls behind it are answered in order, or handed back."""
        proc, pending = worker.proc, worker.pending
        try:
            while True:
                reply = await self._recv(proc)
                head = next(iter(pending), None)
                call = pending.pop(reply.get("id"), None)
                if call is None:
                    raise WorkerDied(f"an answer nobody asked for ({reply.get('id')})")
                if call.timer is not None:
                    call.timer.cancel()
                if not call.future.done():
                    returned = reply.get("op") == "returned"
                    call.future.set_result(_UNSTARTED if returned else ExecResult.from_dict(reply["result"]))
                if call.id == head and pending:
                    self._arm(pending[next(iter(pending))], proc)
        except Exception as exc:  # noqa: BLE001 - the worker died or broke the protocol
            if worker.lost:  # closed on purpose
                return
            what = "did not answer in time" if getattr(proc, "overdue", False) else type(exc).__name__
            await self._worker_lost(worker, what)

    async def _worker_lost(self, worker: _WorkerProcess, what: str) -> None:
        worker.lost = True  # from now on calls go to a replacement
        self.restarts += 1
        for i, call in enumerate(worker.pending.values()):
            if call.timer is not None:
                call.timer.cancel()
            if call.future.done():
                continue
            if i == 0:  # the call it was running
                reason = f"sandbox worker {self.index} lost ({what}); replaced"
                call.future.set_result(ExecResult.failure("internal", reason))
            else:  # never started: it goes again, to the replacement or another worker
                call.future.set_result(_UNSTARTED)
        worker.pending.clear()
        await self._kill(worker.proc, worker.hello)

    @staticmethod
    def _send(proc: asyncio.subprocess.Process, obj: dict) -> None:
        assert proc.stdin is not None
        proc.stdin.write(encode(obj))

    async def _recv(self, proc: asyncio.subprocess.Process) -> dict:
        assert proc.stdout is not None
        try:
            return await read_msg(proc.stdout)
        except asyncio.IncompleteReadError as exc:
            raise WorkerDied(f"worker {self.index} exited") from exc
