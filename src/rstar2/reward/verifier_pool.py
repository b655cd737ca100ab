"""Time-boxed checking in worker processes, without signals: ``math-verify``'s ``signal.alarm``
works only in the main thread and can be swallowed by sympy. Each CAS check runs in a checker
process under an address-space cap; one over its box in CPU time (or 3x in wall time, when a busy
machine starves it) is killed and replaced by a fork of the pre-warmed template (``checker.py``),
and its check counts as "not equivalent". Fast-path answers never leave the caller's process."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from ..config import DEFAULT_ROLLOUT
from ..gym import scored_by_task
from .equivalence import Verdict, triage
from .extract import Mode
from .guards import MEMORY_CAP_REASON

_log = logging.getLogger("rstar2.reward")
DEFAULT_TIMEOUT_S = 2.0
# a reasoning-gym task's own scorer: its first check in a checker also imports reasoning-gym (~1 s)
TASK_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 2048
_START_TIMEOUT_S = 120.0
_WALL_BACKSTOP = 3.0  # a check may take up to 3x its box in wall time if it was starved of CPU
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class _Task:
    reference: str
    answer: str
    future: Future
    submitted: float
    timeout_s: float  # its time box
    gym: dict[str, Any] | None  # the reasoning-gym task whose scorer decides (rstar2.gym)


class _Template:
    """The template process (``rstar2.reward.checker``) that forks pre-warmed checkers."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.control: socket.socket | None = None
        self.lock = threading.RLock()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
        command = [sys.executable, "-m", "rstar2.reward.checker", str(theirs.fileno())]
        self.proc = subprocess.Popen(command, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        ours.settimeout(_START_TIMEOUT_S)
        if ours.recv(1) != b"R":
            ours.close()
            raise RuntimeError("the verifier template process did not start")
        self.control = ours

    def spawn(self, memory_mb: int) -> tuple[int, Connection]:
        """A new checker (its pid and the socket to it); a template that died is started again."""
        with self.lock:
            for attempt in range(2):
                try:
                    if self.proc is None or self.proc.poll() is not None or self.control is None:
                        self.close()
                        self._start()
                    assert self.control is not None
                    self.control.sendall(str(memory_mb).encode())
                    msg, fds, _, _ = socket.recv_fds(self.control, 64, 1)
                    return int(msg), Connection(fds[0])
                except (OSError, RuntimeError, ValueError, IndexError):
                    self.close()
                    if attempt:
                        raise
            raise RuntimeError("unreachable")

    def close(self) -> None:
        with self.lock:
            if self.control is not None:
                self.control.close()
                self.control = None
            if self.proc is not None:
                if self.proc.poll() is None:
                    self.proc.kill()
                self.proc.wait(timeout=10)
                self.proc = None


def _process_wide(factory: Callable[[], Any]) -> Callable[[], Any]:
    """One lazily made instance per process, closed at exit."""
    lock, made = threading.Lock(), []

    def get() -> Any:
        with lock:
            if not made:
                made.append(factory())
                atexit.register(made[0].close)
            return made[0]

    return get


# One template per process, shared by every pool (its start costs the CAS import).
_template: Callable[[], _Template] = _process_wide(_Template)


class _Worker:
    def __init__(self, template: _Template, memory_mb: int) -> None:
        self.pid, self.conn = template.spawn(memory_mb)
        self.ready = False  # set when the checker has warmed up
        self.task: _Task | None = None
        self.deadline = 0.0  # when to look again at the running check
        self.hard_deadline = 0.0  # wall-clock backstop
        self.cpu_at_start = 0.0

    def cpu_seconds(self) -> float | None:
        """CPU time this checker has used (Linux /proc), or None where unknown."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            return None

    def over_box(self, now: float) -> bool:
        """Over the time box: its CPU time passed the box (a check starved of CPU by a busy
        machine is given more wall time, up to the backstop), or the backstop passed."""
        assert self.task is not None
        if now >= self.hard_deadline or (cpu := self.cpu_seconds()) is None:
            return True
        used = cpu - self.cpu_at_start
        if used >= self.task.timeout_s:
            return True
        self.deadline = now + max(0.05, self.task.timeout_s - used)
        return False

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.conn.close()


@dataclass
class PoolStats:
    timeouts: int = 0
    worker_deaths: int = 0
    replaced: int = 0


class VerifierPool:
    """N checker processes under a hard per-check time box: ``submit`` (a ``Future[Verdict]``),
    ``check``, ``map``, ``acheck``; thread-safe. A check over ``timeout_s`` is "not equivalent"."""

    def __init__(
        self,
        workers: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
        mode: Mode = DEFAULT_ROLLOUT.verify_mode,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.n_workers = max(1, workers or min(4, os.cpu_count() or 1))
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.mode = mode
        self.stats = PoolStats()
        self._pending: deque[_Task] = deque()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._closed = False
        self._thread: threading.Thread | None = None
        self._template = _template()
        self._workers: list[_Worker | None] = []

    def start(self) -> VerifierPool:
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._dispatch, name="verifier-pool", daemon=True)
                self._thread.start()
        return self

    def submit(
        self,
        reference: str,
        response: str,
        *,
        extracted: bool = False,
        timeout_s: float | None = None,
        mode: Mode | None = None,
        gym: dict[str, Any] | None = None,
    ) -> Future:
        """Grade ``response`` (a whole model output, or an answer when ``extracted``);
        ``timeout_s`` and ``mode`` override the pool's for this check. ``gym``: a reasoning-gym
        problem's scorer inputs; its task's own scorer decides where ``rstar2.gym.scored_by_task``
        says, in a checker like a CAS check, under ``TASK_TIMEOUT_S``."""
        future: Future = Future()
        start = time.perf_counter()
        by_task = scored_by_task(gym, str(reference))
        verdict, answer = triage(
            reference, response, mode=mode or self.mode, extracted=extracted, fast=not by_task
        )
        if by_task:
            timeout_s = timeout_s or TASK_TIMEOUT_S
        if verdict is not None:
            verdict.seconds = time.perf_counter() - start
            future.set_result(verdict)
            return future
        if self._closed:
            raise RuntimeError("VerifierPool is closed")
        self.start()
        task = _Task(
            str(reference), str(answer), future, start, timeout_s or self.timeout_s, gym if by_task else None
        )
        with self._lock:
            self._pending.append(task)
        self._wake()
        return future

    def check(self, reference: str, response: str, **options: Any) -> Verdict:
        return self.submit(reference, response, **options).result()

    async def acheck(self, reference: str, response: str, **options: Any) -> Verdict:
        return await asyncio.wrap_future(self.submit(reference, response, **options))

    def map(
        self,
        pairs: Iterable[tuple[str, str]],
        *,
        extracted: bool = False,
        on_done: Callable[[Verdict], None] | None = None,
    ) -> list[Verdict]:
        futures = [self.submit(ref, resp, extracted=extracted) for ref, resp in pairs]
        if on_done is not None:
            for f in futures:
                f.add_done_callback(lambda f: on_done(f.result()))
        return [f.result() for f in futures]

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> VerifierPool:
        return self  # the checkers start on the first check that needs the CAS

    def __exit__(self, *exc) -> None:
        self.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _dispatch(self) -> None:
        workers: list[_Worker | None] = [None] * self.n_workers
        self._workers = workers
        try:
            while True:
                with self._lock:
                    closing = self._closed
                if closing:
                    self._fail_pending("verifier pool closed")
                    return
                self._fill(workers)
                live = [w for w in workers if w is not None]
                self._assign(live)
                now = time.perf_counter()
                deadlines = [w.deadline for w in live if w.task is not None]
                timeout = max(0.0, min(deadlines, default=now + 1.0) - now)  # none running: 1 s
                ready = wait([w.conn for w in live] + [self._wake_r], timeout=timeout)
                if self._wake_r in ready:
                    with contextlib.suppress(BlockingIOError):
                        while self._wake_r.recv(4096):
                            pass
                for i, w in enumerate(workers):
                    if w is not None and w.conn in ready:
                        workers[i] = self._receive(w)
                self._expire(workers, time.perf_counter())
        finally:
            for w in workers:
                if w is not None:
                    w.kill()

    def _expire(self, workers: list[_Worker | None], now: float) -> None:
        """Kill checkers over their time box; their checks count as wrong ("timeout")."""
        for i, w in enumerate(workers):
            if w is None or w.task is None or now < w.deadline or not w.over_box(now):
                continue
            task, w.task = w.task, None
            used = (w.cpu_seconds() or 0.0) - w.cpu_at_start
            w.kill()
            workers[i] = None
            self.stats.replaced += 1
            box = task.timeout_s
            if used < 0.5 * box:  # the wall-clock backstop, not the answer: the machine starved it
                _log.warning("answer check starved of CPU past its backstop (%.2f s CPU used)", used)
                reason, path = f"stalled: {used:.2f} s CPU in {now - task.submitted:.1f} s", "stalled"
            else:
                self.stats.timeouts += 1  # counted before the caller can see the verdict
                _log.warning("answer check over its %.1f s time box (counted wrong): %.80r", box, task.answer)
                reason = path = "timeout"
            task.future.set_result(Verdict(False, reason, task.answer, path, now - task.submitted))

    def _fill(self, workers: list[_Worker | None]) -> None:
        for i, w in enumerate(workers):
            if w is None:
                try:
                    workers[i] = _Worker(self._template, self.memory_mb)
                except (OSError, RuntimeError) as exc:
                    self._fail_pending(f"verifier workers cannot start: {exc}")
                    return

    def _assign(self, workers: list[_Worker]) -> None:
        for w in workers:
            if not w.ready or w.task is not None:
                continue
            with self._lock:
                if not self._pending:
                    return
                task = self._pending.popleft()
            box, now = task.timeout_s, time.perf_counter()
            w.task, w.deadline = task, now + box
            w.hard_deadline = now + box * _WALL_BACKSTOP
            w.cpu_at_start = w.cpu_seconds() or 0.0
            try:
                w.conn.send((task.reference, task.answer, task.gym))
            except OSError:
                pass  # the worker died; _receive sees EOF and replaces it

    def _receive(self, w: _Worker) -> _Worker | None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            self.stats.worker_deaths += 1
            if w.task is not None:
                task, seconds = w.task, time.perf_counter() - w.task.submitted
                task.future.set_result(Verdict(False, "verifier worker died", task.answer, "error", seconds))
            w.kill()
            return None
        if msg == "ready":
            w.ready = True
            return w
        task, w.task = w.task, None
        fatal = msg.get("reason") == MEMORY_CAP_REASON
        if fatal:
            w.kill()
            self.stats.replaced += 1
        if task is not None:
            verdict = Verdict.from_dict(msg)
            verdict.seconds = time.perf_counter() - task.submitted
            task.future.set_result(verdict)
        return None if fatal else w

    def _fail_pending(self, reason: str) -> None:
        with self._lock:
            pending, self._pending = list(self._pending), deque()
        for task in pending:
            task.future.set_result(Verdict(False, reason, task.answer, "error"))


# the pool behind ``verify_answer`` (its workers start on the first CAS check)
default_pool: Callable[[], VerifierPool] = _process_wide(VerifierPool)


def verify_batch(
    pairs: Iterable[tuple[str, str]],
    workers: int | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    mode: Mode = DEFAULT_ROLLOUT.verify_mode,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> list[Verdict]:
    """Grade many (reference, response) pairs on ``workers`` processes; one verdict per pair."""
    with VerifierPool(workers, timeout_s=timeout_s, memory_mb=memory_mb, mode=mode) as pool:
        return pool.map(list(pairs))
