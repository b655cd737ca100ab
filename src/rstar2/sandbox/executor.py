"""The parent side of one pre-warmed worker: starts it, sends it calls, restarts it when it dies.

The wall-clock limit is enforced by the worker (outside the child); this side adds a backstop: a
worker that does not answer within the call's timeout plus a grace period is killed and replaced,
and the call gets status ``internal`` instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import struct
import sys

from .isolation import IsolationConfig, remove_cgroups
from .result import ExecRequest, ExecResult, Limits

_HEADER = struct.Struct("!I")
_GRACE_S = 60.0  # on top of a call's timeout: the kernel tearing down a big process tree can be slow
_START_TIMEOUT_S = 120.0


class WorkerDied(RuntimeError):
    pass


class Executor:
    def __init__(
        self,
        index: int,
        limits: Limits,
        isolation: IsolationConfig,
        preload: list[str] | None = None,
        max_sessions: int = 64,
        session_idle_s: float = 600.0,
    ) -> None:
        self.index = index
        self.max_sessions = max_sessions
        self.session_idle_s = session_idle_s
        self.limits = limits
        self.isolation = isolation
        self.preload = preload
        self.proc: asyncio.subprocess.Process | None = None
        self.hello: dict = {}
        self.lock = asyncio.Lock()
        self.restarts = 0
        self._ids = itertools.count()

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            return
        cfg = {
            "index": self.index,
            "isolation": self.isolation.to_dict(),
            "limits": self.limits.to_dict(),
            "max_sessions": self.max_sessions,
            "session_idle_s": self.session_idle_s,
        }
        if self.preload is not None:
            cfg["preload"] = list(self.preload)
        env = {
            k: v
            for k, v in os.environ.items()
            if k in ("PATH", "PYTHONPATH", "LANG", "VIRTUAL_ENV", "RSTAR2_HUGE_PAGES")
        }
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        env.update(
            {
                "OPENBLAS_NUM_THREADS": "1",
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rstar2.sandbox.worker",
            json.dumps(cfg),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            limit=1 << 26,
        )
        try:
            hello = await asyncio.wait_for(self._recv(), _START_TIMEOUT_S)
        except (asyncio.TimeoutError, WorkerDied) as exc:
            await self._kill()
            raise RuntimeError(f"sandbox worker {self.index} failed to start: {exc!r}") from exc
        self.hello = hello

    async def close(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            try:
                self._send({"op": "exit"})
                await asyncio.wait_for(proc.wait(), 5)
            except Exception:  # noqa: BLE001
                await self._kill()
        self._cleanup()
        self.proc = None

    async def _kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            await proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        if self.hello.get("cgroup"):
            remove_cgroups(self.hello["cgroup"])
        if self.hello.get("root_dir"):
            try:
                os.rmdir(self.hello["root_dir"])
            except OSError:
                pass

    @property
    def layers(self) -> list[dict]:
        return list(self.hello.get("layers", []))

    # ------------------------------------------------------------------ calls
    async def run(self, req: ExecRequest) -> ExecResult:
        async with self.lock:
            return await self._run_locked(req)

    async def _run_locked(self, req: ExecRequest) -> ExecResult:
        limits = self.limits.merged(req.timeout_s, req.memory_mb)
        try:
            await self.start()
        except RuntimeError as exc:
            return ExecResult.failure("internal", str(exc))
        msg = {
            "op": "run",
            "id": next(self._ids),
            "code": req.code,
            "input": req.input,
            "session_id": req.session_id,
            "limits": {"timeout_s": limits.timeout_s, "memory_mb": limits.memory_mb},
        }
        # A timer rather than asyncio.wait_for (a task per call): a worker that overruns is killed,
        # which ends the read below.
        proc = self.proc
        overdue = asyncio.get_running_loop().call_later(limits.timeout_s + _GRACE_S, self._overdue, proc)
        try:
            self._send(msg)
            reply = await self._recv()
            return ExecResult.from_dict(reply["result"])
        except (WorkerDied, ConnectionError, OSError) as exc:
            self.restarts += 1
            what = "did not answer in time" if getattr(proc, "overdue", False) else type(exc).__name__
            await self._kill()
            self.proc = None
            return ExecResult.failure("internal", f"sandbox worker {self.index} lost ({what}); replaced")
        except asyncio.CancelledError:
            # the caller gave up mid-call: the worker's state is unknown, replace it
            await self._kill()
            self.proc = None
            raise
        finally:
            overdue.cancel()

    @staticmethod
    def _overdue(proc: asyncio.subprocess.Process | None) -> None:
        if proc is not None and proc.returncode is None:
            proc.overdue = True  # type: ignore[attr-defined]
            proc.kill()

    def _send(self, obj: dict) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        data = json.dumps(obj).encode()
        self.proc.stdin.write(_HEADER.pack(len(data)) + data)

    async def _recv(self) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            header = await self.proc.stdout.readexactly(_HEADER.size)
            (size,) = _HEADER.unpack(header)
            return json.loads(await self.proc.stdout.readexactly(size))
        except asyncio.IncompleteReadError as exc:
            raise WorkerDied(f"worker {self.index} exited") from exc
