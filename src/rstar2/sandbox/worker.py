"""The sandbox worker: one process per executor, running one call at a time.

It sets up the isolation layers once, then forks its zygotes (`zygote.py`): pre-warmed processes that
only fork. A "light" zygote holds the standard library the calls commonly use; a "full" one also holds
numpy, sympy and whatever else was preloaded. A call goes to the light zygote when everything its code
imports is already imported there (most model-written arithmetic), else to the full one; sessions
always live in the full one. Forking the smaller process is cheaper, and keeping this process's
bookkeeping (capture, timeouts, results) out of the process that forks spares the copies that every
page written after a fork costs.

It speaks length-prefixed JSON with its parent (`executor.Executor`) over two inherited pipes. Run as
``python -m rstar2.sandbox.worker CONFIG_JSON``.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import sys
import time
from collections import deque

from . import linux
from .capture import Capture, cut_middle
from .isolation import IsolationConfig, WorkerIsolation, reap_ready
from .result import ExecResult, Limits
from .session import SessionHandle, SessionTable
from .zygote import ENDED, INTERNAL_EXIT, PID, PRELOAD, serve

_MAX_CTRL = 1 << 16
_HEADER = struct.Struct("!I")
_ZYGOTE_START_S = 120.0
_IMPORT = re.compile(r"(?:^|[;:])[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import\b|import[ \t]+([\w. \t,]+))", re.M)


# ----------------------------------------------------------------------------- framing
def send_msg(fd: int, obj: dict) -> None:
    data = json.dumps(obj).encode()
    buf = _HEADER.pack(len(data)) + data
    view = memoryview(buf)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def recv_msg(fd: int) -> dict | None:
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    body = _read_exact(fd, size)
    return None if body is None else json.loads(body)


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = os.read(fd, size - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


class Inbox:
    """Requests from the executor, which keeps up to two outstanding per worker. While a call runs,
    the next request is read ahead; if the running call turns out slow (`HAND_BACK_S`), a queued
    call (not a session's) is handed back unstarted so that another worker takes it."""

    HAND_BACK_S = 0.05

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd, self.wfd = rfd, wfd
        self.backlog: deque[dict | None] = deque()  # None: the executor closed the pipe

    def next(self) -> dict | None:
        return self.backlog.popleft() if self.backlog else recv_msg(self.rfd)

    @property
    def open(self) -> bool:
        return not self.backlog or self.backlog[-1] is not None

    def read_one(self) -> None:
        self.backlog.append(recv_msg(self.rfd))

    @staticmethod
    def _returnable(msg: dict | None) -> bool:
        return msg is not None and msg.get("op") == "run" and not msg.get("session_id")

    def can_hand_back(self) -> bool:
        return any(self._returnable(m) for m in self.backlog)

    def hand_back(self) -> None:
        for msg in self.backlog:
            if self._returnable(msg):
                send_msg(self.wfd, {"op": "returned", "id": msg["id"]})
        self.backlog = deque(m for m in self.backlog if not self._returnable(m))


# ----------------------------------------------------------------------------- routing
def imported_modules(code: str) -> set[str] | None:
    """Top-level names of the modules `code` imports by statement; None if it imports dynamically.

    A textual scan (the code is never parsed here, outside the sandbox): an import it misses only
    sends the call to the light zygote, where the import still works, just slower.
    """
    if "__import__" in code or "importlib" in code:
        return None
    names: set[str] = set()
    for match in _IMPORT.finditer(code):
        if match.group(1) is not None:
            names.add(match.group(1).partition(".")[0])
            continue
        for part in match.group(2).split(","):
            words = part.split()
            if words:
                names.add(words[0].partition(".")[0])
    return names


def fits_light(code: str, light_modules: frozenset[str]) -> bool:
    """Whether everything `code` imports is already imported in the light zygote."""
    names = imported_modules(code)
    return names is not None and names <= light_modules


def split_preload(modules: list[str]) -> tuple[list[str], list[str]]:
    """(light, full) preload lists: the light zygote takes the standard-library part."""
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    light = [m for m in modules if m.partition(".")[0] in stdlib]
    return light, list(modules)


# ----------------------------------------------------------------------------- zygotes
class ZygoteLost(RuntimeError):
    pass


class ZygoteHandle:
    """The worker's side of one zygote: starts it, asks it to fork, restarts it when it died."""

    def __init__(self, name: str, modules: list[str]) -> None:
        self.name = name
        self.modules = modules
        self.pid = 0
        self.pidfd: int | None = None
        self.sock: socket.socket | None = None
        self.hello: dict = {}
        self.loaded: frozenset[str] = frozenset()  # top-level names of every module it has imported

    def start(self, iso: WorkerIsolation, defaults: Limits, proc_fd: int | None) -> None:
        self.stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                keep = {theirs.fileno(), *(fd for fd in (proc_fd, iso.pid_ns_fd) if fd is not None)}
                linux.close_fds_except(keep)
                serve(theirs, iso, self.modules, defaults, proc_fd)
            finally:
                os._exit(INTERNAL_EXIT)
        theirs.close()
        self.pid, self.sock, self.pidfd = pid, ours, os.pidfd_open(pid)
        ready, _, _ = select.select([ours], [], [], _ZYGOTE_START_S)
        msg = ours.recv(_MAX_CTRL) if ready else b""
        if not msg:
            self.stop()
            raise ZygoteLost(f"the {self.name} zygote failed to start")
        self.hello = json.loads(msg)
        self.loaded = frozenset(self.hello.get("modules", []))

    def stop(self) -> None:
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            os.close(self.pidfd)
        if self.sock is not None:
            self.sock.close()
        self.pidfd, self.sock = None, None

    def fork(self, header: bytes, fds: list[int]) -> tuple[int, int | None]:
        """Send a request; returns (pid, pidfd) of the new child, or (-1, None) if fork failed."""
        assert self.sock is not None
        try:
            socket.send_fds(self.sock, [header], fds)
            msg, got, _, _ = socket.recv_fds(self.sock, 64, 1)
        except OSError as exc:
            self.stop()
            raise ZygoteLost(f"the {self.name} zygote is gone ({exc})") from exc
        if len(msg) < 1 + PID.size or msg[:1] != b"p":
            for fd in got:
                os.close(fd)
            self.stop()
            raise ZygoteLost(f"the {self.name} zygote is gone")
        (pid,) = PID.unpack(msg[1 : 1 + PID.size])
        return (pid, got[0]) if pid > 0 and got else (-1, None)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


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
        self.inbox = inbox
        self.iso = iso
        self.defaults = defaults
        self.sessions = sessions
        self.proc_fd = proc_fd
        light, full = split_preload(modules)
        self.full = ZygoteHandle("full", full)
        self.light = ZygoteHandle("light", light) if light != full else None
        self.devnull = os.open(os.devnull, os.O_RDONLY)
        self._limits: dict[tuple, tuple[Limits, bytes]] = {}  # request overrides -> limits, their JSON

    def limits_for(self, overrides: dict | None) -> tuple[Limits, bytes]:
        """The call's limits (the defaults with the request's overrides) and their JSON, memoised."""
        key = tuple(sorted((overrides or {}).items()))
        hit = self._limits.get(key)
        if hit is None:
            if len(self._limits) > 256:
                self._limits.clear()
            limits = Limits.from_dict({**self.defaults.to_dict(), **dict(key)})
            hit = self._limits[key] = (limits, json.dumps(limits.to_dict(), sort_keys=True).encode())
        return hit

    @property
    def zygotes(self) -> list[ZygoteHandle]:
        return [z for z in (self.light, self.full) if z is not None]

    def start(self) -> None:
        for zyg in self.zygotes:
            zyg.start(self.iso, self.defaults, self.proc_fd)

    def _zygote_for(self, code: str | None) -> ZygoteHandle:
        """The light zygote when `code` fits it (None: a session, always the full one)."""
        light = self.light
        zyg = (
            light if light is not None and code is not None and fits_light(code, light.loaded) else self.full
        )
        if zyg.sock is None:  # never started, or found dead
            zyg.start(self.iso, self.defaults, self.proc_fd)
        return zyg

    def _fork(self, zyg: ZygoteHandle, header: bytes, fds: list[int]) -> tuple[int, int | None]:
        """Ask `zyg` for a child; a zygote found dead (it died since its last call) is started afresh
        and asked once more."""
        try:
            return zyg.fork(header, fds)
        except ZygoteLost:
            zyg.start(self.iso, self.defaults, self.proc_fd)
            return zyg.fork(header, fds)

    def run(self, req: dict) -> ExecResult:
        limits, limits_json = self.limits_for(req.get("limits"))
        if req.get("session_id"):
            return self.run_session(req, limits)
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
        try:
            zyg = self._zygote_for(code)
        except ZygoteLost as exc:
            return ExecResult.failure("internal", str(exc))
        header = b"c" + limits_json + b"\0" + (tmp_dir or "").encode()
        code_fd = _memfd("code", code.encode("utf-8", "surrogateescape"))
        text = req.get("input") or ""
        stdin_fd = _memfd("stdin", text.encode("utf-8", "surrogateescape")) if text else self.devnull
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        self.iso.prepare_call(limits)
        try:
            pid, pidfd = self._fork(zyg, header, [code_fd, stdin_fd, out_w, err_w, res_w])
        except ZygoteLost as exc:
            pid, pidfd, lost = -1, None, str(exc)
        else:
            lost = "fork failed"
        for fd in (code_fd, out_w, err_w, res_w):
            os.close(fd)
        if stdin_fd != self.devnull:
            os.close(stdin_fd)
        if pidfd is None:
            for fd in (out_r, err_r, res_r):
                os.close(fd)
            return ExecResult.failure("internal", lost)
        return self._collect(zyg, pid, pidfd, limits, t0, out_r, err_r, res_r)

    def _collect(
        self,
        zyg: ZygoteHandle,
        pid: int,
        pidfd: int,
        limits: Limits,
        t0: float,
        out_r: int,
        err_r: int,
        res_r: int,
    ) -> ExecResult:
        out, err, res = Capture(limits.output_bytes), Capture(limits.output_bytes), Capture(4 << 20)
        streams = {out_r: out, err_r: err, res_r: res}
        assert zyg.sock is not None
        ctl = zyg.sock.fileno()
        poller = select.poll()
        for fd in (*streams, ctl):
            poller.register(fd, select.POLLIN)
        inbox = self.inbox
        if inbox.open:
            poller.register(inbox.rfd, select.POLLIN)
        hand_back_at = t0 + Inbox.HAND_BACK_S
        deadline = t0 + limits.timeout_s
        hard_limit = int(limits.max_output_mb * 1024 * 1024)
        killed: str | None = None
        exited_at: float | None = None
        ended: tuple[int, float] | None = None  # wait status, CPU seconds
        open_fds = set(streams)
        while open_fds or exited_at is None:
            now = time.monotonic()
            if exited_at is not None:
                wait = exited_at + 0.2 - now  # leftover writers (no PID namespace) get a short grace
            elif killed is not None:
                wait = 2.0
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
                killed = "timeout"
                _kill(pidfd)
                continue
            for fd, _ in poller.poll(wait * 1000):
                if fd == inbox.rfd:
                    inbox.read_one()
                    if not inbox.open or len(inbox.backlog) >= 8:
                        poller.unregister(fd)  # closed, or enough read ahead
                    continue
                if fd == ctl:
                    exited_at = time.monotonic()
                    poller.unregister(ctl)
                    ended = _ended(zyg, pid)
                    continue
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    streams[fd].feed(chunk)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
            if killed is None and out.total + err.total > hard_limit:
                killed = "output_limit"
                _kill(pidfd)
        duration = time.monotonic() - t0
        if exited_at is None:  # killed, and the zygote has not reported the end yet: wait for it
            _kill(pidfd)
            ready = select.select([ctl], [], [], 30.0)[0]
            ended = _ended(zyg, pid) if ready else None
            if not ready:
                zyg.stop()  # it does not answer: start afresh on the next call
        if ended is None:  # its zygote was lost: make sure the call is gone too
            _kill(pidfd)
        if self.iso.pid_ns_fd is None:  # without a PID namespace: end what the call left behind
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            if self.iso.cgroup is not None:  # setsid daemons left the process group, not the cgroup
                self.iso.cgroup.kill_all_but({os.getpid(), *(z.pid for z in self.zygotes)})
            reap_ready()
        for fd in (*streams, pidfd):
            os.close(fd)
        oom = self.iso.cgroup is not None and self.iso.cgroup.new_oom_kills() > 0
        if ended is None:
            result = self._result(limits, duration, out, err, res, None, killed, oom, None)
            if killed is None:
                result.status = "internal"
                result.reason = (
                    f"the {zyg.name} zygote was lost during the call; a new one serves the next call"
                )
            return result
        return self._result(limits, duration, out, err, res, ended[0], killed, oom, ended[1])

    def _result(
        self,
        limits: Limits,
        duration: float,
        out: Capture,
        err: Capture,
        res: Capture,
        wstatus: int | None,
        killed: str | None,
        oom: bool,
        cpu_s: float | None,
    ) -> ExecResult:
        report = {}
        if res.total:
            try:
                report = json.loads(bytes(res.head) + bytes(res.tail))
            except ValueError:
                report = {}
        result = ExecResult(
            status="ok",
            stdout=out.text(),
            stderr=err.text(),
            duration_s=round(duration, 6),
            truncated=out.truncated or err.truncated,
            cpu_s=round(cpu_s, 6) if cpu_s is not None else None,
            error_type=report.get("error_type"),
        )
        if "value" in report and not out.total:
            result.value, cut = cut_middle(report["value"], limits.output_bytes)
            result.truncated = result.truncated or cut
        if wstatus is not None and os.WIFSIGNALED(wstatus):
            sig = os.WTERMSIG(wstatus)
            result.signal = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        elif wstatus is not None:
            result.exit_code = os.WEXITSTATUS(wstatus)
        if killed == "timeout":
            result.status, result.reason = "timeout", f"wall-clock limit of {limits.timeout_s:g} s exceeded"
            result.signal = None
        elif killed == "output_limit":
            result.status = "output_limit"
            result.reason = f"printed more than {limits.max_output_mb:g} MB; stopped"
            result.signal = None
        elif "internal" in report or result.exit_code == INTERNAL_EXIT:
            result.status, result.reason = "internal", report.get("internal", "the worker child failed")
        elif oom or result.error_type == "MemoryError":
            result.status = "memory"
            result.reason = f"memory limit of {limits.memory_mb} MB exceeded"
        elif result.signal == "SIGXCPU":
            result.status, result.reason = "timeout", f"CPU limit of {limits.effective_cpu_s()} s exceeded"
        elif result.signal is not None:
            result.status, result.reason = "error", f"killed by {result.signal}"
        elif result.exit_code:
            result.status = "error"
            result.reason = result.error_type or f"exit code {result.exit_code}"
        return result

    # ------------------------------------------------------------------------- sessions
    def run_session(self, req: dict, limits: Limits) -> ExecResult:
        sid = req["session_id"]
        table = self.sessions
        table.expire(time.monotonic())
        handle = table.touch(sid)
        if handle is None:
            if sid in table.gone:
                return ExecResult.failure(
                    "rejected", f"session {sid!r} {table.gone[sid]}; use a new session_id"
                )
            if self.iso.pid_ns_fd is None:
                return ExecResult.failure(
                    "rejected", "stateful sessions need PID namespaces, unavailable here"
                )
            table.make_room()
            try:
                handle = self._new_session(sid, limits)
            except OSError as exc:
                return ExecResult.failure("internal", f"could not start session: {exc}")
            table.add(handle)
        t0 = time.monotonic()
        stdin_fd = _memfd("stdin", (req.get("input") or "").encode("utf-8", "surrogateescape"))
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        handle.seq += 1
        cmd = {"op": "cell", "seq": handle.seq, "code": req["code"], "limits": limits.to_dict()}
        self.iso.prepare_call(limits)
        cg = self.iso.cgroup
        if cg is not None:
            cg.new_oom_kills()  # forget kills from before this cell
        try:
            socket.send_fds(handle.sock, [json.dumps(cmd).encode()], [stdin_fd, out_w, err_w, res_w])
        except OSError as exc:
            for fd in (stdin_fd, out_r, out_w, err_r, err_w, res_r, res_w):
                os.close(fd)
            table.forget(sid, "was lost")
            return ExecResult.failure("internal", f"session {sid!r} was lost ({exc}); use a new session_id")
        for fd in (stdin_fd, out_w, err_w, res_w):
            os.close(fd)
        out, err, res = Capture(limits.output_bytes), Capture(limits.output_bytes), Capture(4 << 20)
        streams = {out_r: out, err_r: err, res_r: res}
        poller = select.poll()
        for fd in (*streams, handle.sock.fileno(), handle.pidfd):
            poller.register(fd, select.POLLIN)
        open_fds = set(streams)
        deadline = t0 + limits.timeout_s
        hard_limit = int(limits.max_output_mb * 1024 * 1024)
        killed: str | None = None
        outcome: dict | None = None
        lost = False
        abort_sent_at: float | None = None
        while (outcome is None and not lost) or open_fds:
            now = time.monotonic()
            if outcome is not None or lost:
                wait = 0.2  # drain what is left in the pipes
            elif abort_sent_at is not None:
                wait = abort_sent_at + 2.0 - now
                if wait <= 0:  # the holder does not answer: give the whole session up
                    lost = True
                    break
            else:
                wait = deadline - now
                if wait <= 0 or (killed is None and out.total + err.total > hard_limit):
                    killed = killed or ("timeout" if wait <= 0 else "output_limit")
                    abort_sent_at = now
                    try:
                        handle.sock.send(json.dumps({"op": "abort", "seq": handle.seq}).encode())
                    except OSError:
                        lost = True
                    continue
            events = poller.poll(max(0.0, wait) * 1000)
            if not events and (outcome is not None or lost):
                break
            for fd, _ in events:
                if fd == handle.pidfd:
                    lost = True
                    poller.unregister(fd)
                elif fd == handle.sock.fileno():
                    try:
                        msg = handle.sock.recv(_MAX_CTRL)
                    except OSError:
                        msg = b""
                    if not msg:
                        lost = True
                        poller.unregister(fd)
                        continue
                    reply = json.loads(msg)
                    if reply.get("seq") == handle.seq:
                        outcome = reply
                else:
                    chunk = os.read(fd, 1 << 16)
                    if chunk:
                        streams[fd].feed(chunk)
                        if killed is None and out.total + err.total > hard_limit:
                            killed = "output_limit"
                            abort_sent_at = time.monotonic()
                            try:
                                handle.sock.send(json.dumps({"op": "abort", "seq": handle.seq}).encode())
                            except OSError:
                                lost = True
                    else:
                        poller.unregister(fd)
                        open_fds.discard(fd)
        for fd in streams:
            os.close(fd)
        duration = time.monotonic() - t0
        oom = cg is not None and cg.new_oom_kills() > 0
        if outcome is None:
            lost = True
        wstatus: int | None = None
        if outcome is not None and "done" in outcome:
            wstatus = (int(outcome["done"]) & 0xFF) << 8
            handle.cells += 1
        elif outcome is not None and "crashed" in outcome:
            wstatus = int(outcome["crashed"])
        elif outcome is not None and "status" in outcome:
            wstatus = int(outcome["status"])
        if killed is not None and outcome is not None and "done" in outcome:
            killed = None  # it finished just as the limit struck: keep its result
        result = self._result(limits, duration, out, err, res, wstatus, killed, oom, None)
        if lost:
            table.forget(sid, "was lost (its process died)")
            note = f"session {sid!r} was lost and has been closed; use a new session_id"
            result.reason = f"{result.reason}; {note}" if result.reason else note
            if result.status == "ok":
                result.status = "error"
        elif outcome is not None and "done" not in outcome:
            note = "the session was restored to its state before this cell"
            result.reason = f"{result.reason}; {note}" if result.reason else note
        result.extra = {"session_id": sid, "cells": handle.cells}
        return result

    def _new_session(self, sid: str, limits: Limits) -> SessionHandle:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            zyg = self._zygote_for(None)
            header = b"s" + json.dumps(limits.to_dict()).encode()
            _, pidfd = self._fork(zyg, header, [theirs.fileno()])
        except ZygoteLost as exc:
            ours.close()
            raise OSError(str(exc)) from exc
        finally:
            theirs.close()
        if pidfd is None:
            ours.close()
            raise OSError("fork failed")
        return SessionHandle(sid, pidfd, ours, time.monotonic())


def _ended(zyg: ZygoteHandle, pid: int) -> tuple[int, float] | None:
    """Read the zygote's report that the call's child ended: (wait status, CPU seconds)."""
    assert zyg.sock is not None
    try:
        msg = zyg.sock.recv(64)
    except OSError:
        msg = b""
    if len(msg) != 1 + ENDED.size or msg[:1] != b"x":
        zyg.stop()  # it died (or broke the protocol): start afresh on the next call
        return None
    ended_pid, status, cpu = ENDED.unpack(msg[1:])
    return (status, cpu) if ended_pid == pid else None


def _kill(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # with a PID namespace: every process of the call
    except ProcessLookupError:
        pass


# ----------------------------------------------------------------------------- main loop
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
    index = int(cfg.get("index", 0))
    if cfg.get("pin_cpu", True):
        # One core per worker (its zygotes and calls inherit it): a process's memory is then only ever
        # live on one CPU, so fork and exit need no cross-CPU TLB shoot-downs (costly on VMs).
        try:
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpus[index % len(cpus)]})
        except OSError:
            pass
    iso = WorkerIsolation(IsolationConfig.from_dict(cfg.get("isolation", {})), index)
    try:  # the zygotes read their memory maps here; the private root hides /proc
        proc_fd: int | None = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        proc_fd = None
    iso.setup()
    sessions = SessionTable(int(cfg.get("max_sessions", 64)), float(cfg.get("session_idle_s", 600)))
    modules = list(cfg.get("preload", PRELOAD))
    inbox = Inbox(rfd, wfd)
    worker = Worker(iso, Limits.from_dict(cfg.get("limits", {})), sessions, modules, proc_fd, inbox)
    worker.start()
    send_msg(
        wfd,
        {
            "op": "hello",
            "pid": os.getpid(),
            "layers": iso.report(),
            "preloaded": worker.full.hello.get("preloaded", []),
            "zygotes": [
                {"name": z.name, "pid": z.pid, **{k: z.hello.get(k) for k in ("preloaded", "huge_mb")}}
                for z in worker.zygotes
            ],
            "cgroup": iso.cgroup.name if iso.cgroup else None,
            "root_dir": iso.root_dir,
        },
    )
    while True:
        msg = inbox.next()
        sessions.expire(time.monotonic())
        if msg is None or msg.get("op") == "exit":
            return 0
        if msg.get("op") == "run":
            try:
                result = worker.run(msg)
            except Exception as exc:  # noqa: BLE001 - report, keep serving
                result = ExecResult.failure("internal", f"worker error: {exc!r}")
            send_msg(wfd, {"op": "result", "id": msg.get("id"), "result": result.to_dict()})
        else:
            send_msg(
                wfd,
                {
                    "op": "result",
                    "id": msg.get("id"),
                    "result": ExecResult.failure("internal", f"unknown op {msg.get('op')!r}").to_dict(),
                },
            )


if __name__ == "__main__":
    sys.exit(main(sys.argv))
