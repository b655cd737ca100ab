"""The sandbox worker (``python -m rstar2.sandbox.worker CONFIG_JSON``): one process per
``WorkerHandle``, running one call at a time. It sets up the isolation layers once, then forks its
light and full zygotes (`zygote.py`; which one takes a call: `routing.py`) and keeps its own
bookkeeping (capture, timeouts, results) out of them, the processes that fork (why: `zygote.py`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import shutil
import signal
import socket
import sys
import time

from . import linux
from .capture import CallOutput
from .cgroups import reap_ready
from .framing import send_msg
from .inbox import Inbox
from .isolation import IsolationConfig, WorkerIsolation
from .outcome import to_result
from .request import Limits
from .result import ExecResult
from .routing import fits_light, split_preload
from .session import SessionHandle, SessionTable, run_cell
from .zygote import PRELOAD, ZygoteHandle, ZygoteLost


class Worker:
    def __init__(
        self,
        iso: WorkerIsolation,
        defaults: Limits,
        sessions: SessionTable,
        modules: list[str],
        proc_fd: int | None,
        inbox: Inbox,
    ) -> None:
        self.inbox, self.iso, self.defaults, self.sessions = inbox, iso, defaults, sessions
        light, full = split_preload(modules)
        self.full = ZygoteHandle("full", full, iso, defaults, proc_fd)
        self.light = ZygoteHandle("light", light, iso, defaults, proc_fd) if light != full else None
        self.devnull = os.open(os.devnull, os.O_RDONLY)

    @property
    def zygotes(self) -> list[ZygoteHandle]:
        return [z for z in (self.light, self.full) if z is not None]

    def run(self, req: dict) -> ExecResult:
        overrides = tuple(sorted((req.get("limits") or {}).items()))
        limits, limits_json = _limits_and_json(self.defaults, overrides)
        if req.get("session_id"):
            return run_cell(self.sessions, self.iso, req, limits, self._new_session)
        if self.iso.fs_ready or not self.iso.config.enabled:
            return self._run_once(req, limits, limits_json, None)
        import tempfile

        tmp = tempfile.mkdtemp(prefix="rstar2-call-")  # no private /tmp here: a temp dir per call
        try:
            if self.iso.uid is not None:
                os.chown(tmp, self.iso.uid, self.iso.uid)
            return self._run_once(req, limits, limits_json, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _run_once(self, req: dict, limits: Limits, limits_json: bytes, tmp_dir: str | None) -> ExecResult:
        t0 = time.monotonic()
        code = req["code"]
        light = self.light
        zygote = light if light is not None and fits_light(code, light.loaded) else self.full
        header = b"c" + limits_json + b"\0" + (tmp_dir or "").encode()
        code_fd = linux.memfd_with("code", code.encode("utf-8", "surrogateescape"))
        text = (req.get("input") or "").encode("utf-8", "surrogateescape")
        stdin_fd = linux.memfd_with("stdin", text) if text else self.devnull
        output = CallOutput(limits)
        self.iso.prepare_call(limits)
        try:
            pid, pidfd = zygote.fork(header, [code_fd, stdin_fd, *output.writing_ends])
        except ZygoteLost as exc:
            pid, pidfd, lost = -1, None, str(exc)
        else:
            lost = "fork failed"
        for fd in (code_fd, *output.writing_ends):
            os.close(fd)
        if stdin_fd != self.devnull:
            os.close(stdin_fd)
        if pidfd is None:
            output.close()
            return ExecResult.failure("internal", lost)
        return self._collect(zygote, pid, pidfd, limits, t0, output)

    def _collect(
        self, zygote: ZygoteHandle, pid: int, pidfd: int, limits: Limits, t0: float, output: CallOutput
    ) -> ExecResult:
        """Watch the call to its end, clear away what it leaves, and say how it ended."""
        killed, reported, ended = self._watch(zygote, pid, pidfd, output, t0, limits.timeout_s)
        duration = time.monotonic() - t0
        if not reported:  # killed, and the zygote has not reported the end yet: wait for it
            _kill(pidfd)
            assert zygote.sock is not None
            if select.select([zygote.sock], [], [], 30.0)[0]:
                ended = zygote.ended(pid)
            else:
                zygote.stop()  # it does not answer: start afresh on the next call
        if ended is None:  # its zygote was lost: make sure the call is gone too
            _kill(pidfd)
        if self.iso.pid_ns_fd is None:
            self._end_leftovers(pid)
        output.close()
        os.close(pidfd)
        oom = self.iso.cgroup is not None and self.iso.cgroup.new_oom_kills() > 0
        wstatus, cpu_s = ended if ended is not None else (None, None)
        result = to_result(limits, duration, output, wstatus, killed, oom, cpu_s)
        if ended is None and killed is None:
            result.status = "internal"
            result.reason = (
                f"the {zygote.name} zygote was lost during the call; a new one serves the next call"
            )
        return result

    def _watch(
        self, zygote: ZygoteHandle, pid: int, pidfd: int, output: CallOutput, t0: float, timeout_s: float
    ) -> tuple[str | None, bool, tuple[int, float] | None]:
        """Capture the call's output until its pipes close and its zygote reports its end; kill it
        over its time or output limit. Meanwhile read requests ahead, and hand back the queued ones
        if the call runs long. Returns why it was killed, whether its end was reported, and that end
        (wait status, CPU seconds; None when the zygote died)."""
        assert zygote.sock is not None
        zygote_fd = zygote.sock.fileno()
        poller = select.poll()
        for fd in (*output.streams, zygote_fd):
            poller.register(fd, select.POLLIN)
        inbox = self.inbox
        if inbox.open:
            poller.register(inbox.rfd, select.POLLIN)
        hand_back_at, deadline = t0 + Inbox.HAND_BACK_S, t0 + timeout_s
        killed: str | None = None
        killed_at: float | None = None
        exited_at: float | None = None  # when the zygote reported the end
        ended: tuple[int, float] | None = None
        open_fds = set(output.streams)
        while open_fds or exited_at is None:
            now = time.monotonic()
            if exited_at is not None:
                wait = exited_at + 0.2 - now  # leftover writers (no PID namespace) get a short grace
            elif killed_at is not None:
                wait = killed_at + 2.0 - now  # then `_collect` waits on the zygote itself
            else:
                wait = deadline - now
            if exited_at is None and inbox.can_hand_back():
                if now >= hand_back_at:
                    inbox.hand_back()
                else:
                    wait = min(wait, hand_back_at - now)
            if wait <= 0:
                if exited_at is not None or killed is not None:
                    break
                killed, killed_at = "timeout", now
                _kill(pidfd)
                continue
            for fd, _ in poller.poll(wait * 1000):
                if fd == inbox.rfd:
                    inbox.read_one()
                    if not inbox.open or len(inbox.backlog) >= 8:
                        poller.unregister(fd)  # closed, or enough read ahead
                elif fd == zygote_fd:
                    exited_at = time.monotonic()
                    poller.unregister(zygote_fd)
                    ended = zygote.ended(pid)
                elif not output.read(fd):
                    poller.unregister(fd)
                    open_fds.discard(fd)
            if killed is None and output.over_limit:
                killed, killed_at = "output_limit", time.monotonic()
                _kill(pidfd)
        return killed, exited_at is not None, ended

    def _end_leftovers(self, pid: int) -> None:
        """Without a PID namespace: end what the call left behind."""
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        if self.iso.cgroup is not None:  # setsid daemons left the process group, not the cgroup
            self.iso.cgroup.kill_all_but({os.getpid(), *(z.pid for z in self.zygotes)})
        reap_ready()

    def _new_session(self, sid: str, limits: Limits) -> SessionHandle:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            header = b"s" + json.dumps(limits.to_dict()).encode()
            _, pidfd = self.full.fork(header, [theirs.fileno()])  # sessions live in the full zygote
        except ZygoteLost as exc:
            ours.close()
            raise OSError(str(exc)) from exc
        finally:
            theirs.close()
        if pidfd is None:
            ours.close()
            raise OSError("fork failed")
        return SessionHandle(sid, pidfd, ours, time.monotonic())


@functools.lru_cache(maxsize=256)
def _limits_and_json(defaults: Limits, overrides: tuple) -> tuple[Limits, bytes]:
    """A call's limits (the defaults with the request's overrides) and their JSON, memoised."""
    limits = Limits.from_dict({**defaults.to_dict(), **dict(overrides)})
    return limits, json.dumps(limits.to_dict(), sort_keys=True).encode()


def _kill(pidfd: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # with a PID namespace: every process of the call


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[1])
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        return 1
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    index = cfg["index"]  # the config is WorkerHandle's, which writes every key but "preload"
    _pin_to_one_cpu(index)
    iso = WorkerIsolation(IsolationConfig.from_dict(cfg["isolation"]), index)
    try:  # the zygotes read their memory maps here; the private root hides /proc
        proc_fd: int | None = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        proc_fd = None
    iso.setup()
    sessions = SessionTable(cfg["max_sessions"], cfg["session_idle_s"])
    modules = list(cfg.get("preload", PRELOAD))
    inbox = Inbox(rfd, wfd)
    worker = Worker(iso, Limits.from_dict(cfg["limits"]), sessions, modules, proc_fd, inbox)
    for zygote in worker.zygotes:
        zygote.start()
    send_msg(wfd, _hello(worker))
    while True:
        msg = inbox.next()
        sessions.expire(time.monotonic())
        if msg is None or msg.get("op") == "exit":
            return 0
        if msg.get("op") != "run":
            result = ExecResult.failure("internal", f"unknown op {msg.get('op')!r}")
        else:
            try:
                result = worker.run(msg)
            except Exception as exc:  # noqa: BLE001 - report, keep serving
                result = ExecResult.failure("internal", f"worker error: {exc!r}")
        send_msg(wfd, {"op": "result", "id": msg.get("id"), "result": result.to_dict()})


def _pin_to_one_cpu(index: int) -> None:
    """One core per worker (its zygotes and calls inherit it): a process's memory is then only ever
    live on one CPU, so fork and exit need no cross-CPU TLB shoot-downs (costly on VMs)."""
    with contextlib.suppress(OSError):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[index % len(cpus)]})


def _hello(worker: Worker) -> dict:
    """What a started worker tells its handle (`rstar2 sandbox info` shows it)."""
    iso = worker.iso
    return {
        "op": "hello",
        "pid": os.getpid(),
        "layers": list(iso.layers.values()),
        "preloaded": worker.full.hello.get("preloaded", []),
        "zygotes": [
            {"name": z.name, "pid": z.pid, **{k: z.hello.get(k) for k in ("preloaded", "huge_mb")}}
            for z in worker.zygotes
        ],
        "cgroup": iso.cgroup.name if iso.cgroup else None,
        "root_dir": iso.root_dir,
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv))
