"""The pre-warmed worker ("zygote"): started once, imports common modules, isolates itself, then
forks one fresh child per call, so a trivial call costs about a fork rather than an interpreter start.

It speaks length-prefixed JSON with its parent (`executor.Executor`) over two inherited pipes and runs
one call at a time. Run as ``python -m rstar2.sandbox.zygote CONFIG_JSON``.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time

from . import linux
from .capture import Capture, cut_middle
from .isolation import IsolationConfig, WorkerIsolation, reap_ready
from .result import ExecResult, Limits
from .runner import run_code
from .session import SessionHandle, SessionTable, session_init

PRELOAD = (
    "math",
    "cmath",
    "fractions",
    "decimal",
    "itertools",
    "collections",
    "functools",
    "re",
    "random",
    "statistics",
    "heapq",
    "bisect",
    "string",
    "json",
    "numpy",
    "sympy",
)
_INTERNAL_EXIT = 125
_MAX_CTRL = 1 << 16
_HEADER = struct.Struct("!I")


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


# ----------------------------------------------------------------------------- one call
def _stdin_memfd(text: str) -> int:
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
    data = text.encode("utf-8", "surrogateescape")
    if data:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    return fd


class Zygote:
    def __init__(self, iso: WorkerIsolation, defaults: Limits, sessions: SessionTable) -> None:
        self.iso = iso
        self.defaults = defaults
        self.sessions = sessions

    def run(self, req: dict) -> ExecResult:
        limits = Limits.from_dict({**self.defaults.to_dict(), **(req.get("limits") or {})})
        if req.get("session_id"):
            return self.run_session(req, limits)
        if self.iso.fs_ready or not self.iso.config.enabled:
            return self._run_once(req, limits, None)
        tmp = tempfile.mkdtemp(prefix="rstar2-call-")  # no private /tmp here: a temp dir per call
        try:
            if self.iso.uid is not None:
                os.chown(tmp, self.iso.uid, self.iso.uid)
            return self._run_once(req, limits, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _run_once(self, req: dict, limits: Limits, tmp_dir: str | None) -> ExecResult:
        t0 = time.monotonic()
        stdin_fd = _stdin_memfd(req.get("input") or "")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        self.iso.prepare_call(limits)
        cg = self.iso.cgroup
        oom_before = cg.oom_kills() if cg is not None else 0
        self.iso.before_fork()
        try:
            pid = os.fork()
        except OSError as exc:
            self.iso.after_fork()
            for fd in (stdin_fd, out_r, out_w, err_r, err_w, res_r, res_w):
                os.close(fd)
            return ExecResult.failure("internal", f"fork failed: {exc}")
        if pid == 0:  # ---------------------------------------------------- the child
            self._child(req["code"], limits, stdin_fd, out_w, err_w, res_w, tmp_dir)
        self.iso.after_fork()
        for fd in (stdin_fd, out_w, err_w, res_w):
            os.close(fd)
        return self._collect(pid, limits, t0, out_r, err_r, res_r, oom_before)

    def _child(
        self,
        code: str,
        limits: Limits,
        stdin_fd: int,
        out_w: int,
        err_w: int,
        res_w: int,
        tmp_dir: str | None,
    ) -> None:
        try:
            os.dup2(stdin_fd, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.dup2(res_w, 3)
            os.closerange(4, 1 << 16)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self.iso.enter_private_fs(limits, tmp_dir)
            self.iso.drop_privileges(limits, tmp_dir)
        except BaseException as exc:  # noqa: BLE001 - never run code half-isolated
            try:
                os.write(3, json.dumps({"internal": f"isolation set-up failed: {exc!r}"}).encode())
            finally:
                os._exit(_INTERNAL_EXIT)
        try:
            status = run_code(code, 3)
        except BaseException:  # noqa: BLE001
            status = 1
        os._exit(status)

    def _collect(
        self, pid: int, limits: Limits, t0: float, out_r: int, err_r: int, res_r: int, oom_before: int
    ) -> ExecResult:
        out, err, res = Capture(limits.output_bytes), Capture(limits.output_bytes), Capture(4 << 20)
        streams = {out_r: out, err_r: err, res_r: res}
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        for fd in (*streams, pidfd):
            poller.register(fd, select.POLLIN)
        deadline = t0 + limits.timeout_s
        hard_limit = int(limits.max_output_mb * 1024 * 1024)
        killed: str | None = None
        exited_at: float | None = None
        open_fds = set(streams)
        while open_fds or exited_at is None:
            now = time.monotonic()
            if exited_at is not None:
                wait = exited_at + 0.2 - now  # leftover writers (no PID namespace) get a short grace
            elif killed is not None:
                wait = 2.0
            else:
                wait = deadline - now
            if wait <= 0:
                if exited_at is not None or killed is not None:
                    break
                killed = "timeout"
                self._kill(pid)
                continue
            for fd, _ in poller.poll(wait * 1000):
                if fd == pidfd:
                    exited_at = time.monotonic()
                    poller.unregister(pidfd)
                    continue
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    streams[fd].feed(chunk)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
            if killed is None and out.total + err.total > hard_limit:
                killed = "output_limit"
                self._kill(pid)
        duration = time.monotonic() - t0
        if exited_at is None:
            self._kill(pid)
        _, wstatus, rusage = os.wait4(pid, 0)
        if self.iso.pid_ns_fd is None:  # without a PID namespace: reap what the call left behind
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            if self.iso.cgroup is not None:  # setsid daemons left the process group, not the cgroup
                self.iso.cgroup.kill_all_but(os.getpid())
            reap_ready()
        for fd in (*streams, pidfd):
            os.close(fd)
        oom = self.iso.cgroup is not None and self.iso.cgroup.oom_kills() > oom_before
        return self._result(
            limits, duration, out, err, res, wstatus, killed, oom, rusage.ru_utime + rusage.ru_stime
        )

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
        elif "internal" in report or result.exit_code == _INTERNAL_EXIT:
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
        stdin_fd = _stdin_memfd(req.get("input") or "")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        handle.seq += 1
        cmd = {"op": "cell", "seq": handle.seq, "code": req["code"], "limits": limits.to_dict()}
        self.iso.prepare_call(limits)
        cg = self.iso.cgroup
        oom_before = cg.oom_kills() if cg is not None else 0
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
        oom = cg is not None and cg.oom_kills() > oom_before
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
        self.iso.before_fork()
        try:
            pid = os.fork()
        except OSError:
            self.iso.after_fork()
            ours.close()
            theirs.close()
            raise
        if pid == 0:  # never returns into the worker's loop
            try:
                ours.close()
                null = os.open(os.devnull, os.O_RDWR)
                for target in (0, 1, 2):
                    os.dup2(null, target)
                keep = theirs.fileno()
                os.closerange(3, keep)
                os.closerange(keep + 1, 1 << 16)
                session_init(self.iso, limits, theirs)
            finally:
                os._exit(125)
        self.iso.after_fork()
        theirs.close()
        return SessionHandle(sid, pid, os.pidfd_open(pid), ours, time.monotonic())

    @staticmethod
    def _kill(pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)  # with a PID namespace this ends every process of the call
        except ProcessLookupError:
            pass


# ----------------------------------------------------------------------------- main loop
def preload(modules: list[str]) -> list[str]:
    loaded = []
    for name in modules:
        try:
            module = importlib.import_module(name)
            loaded.append(name)
        except Exception:  # noqa: BLE001 - optional modules
            continue
        warm_up = getattr(module, "warm_up", None)
        if name.startswith("rstar2.") and callable(warm_up):  # e.g. the verifier's CAS caches
            try:
                warm_up()
            except Exception:  # noqa: BLE001
                pass
    if "sympy" in loaded:  # warm sympy's lazy caches with a typical call
        try:
            import sympy

            sympy.solve(sympy.Symbol("x") ** 2 - 1)
        except Exception:  # noqa: BLE001
            pass
    return loaded


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
        # One core per worker: the worker's memory is then only ever live on one CPU, so fork and exit
        # need no cross-CPU TLB shoot-downs (costly IPIs, very costly on virtual machines).
        try:
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpus[index % len(cpus)]})
        except OSError:
            pass
    iso = WorkerIsolation(IsolationConfig.from_dict(cfg.get("isolation", {})), index)
    loaded = preload(cfg.get("preload", list(PRELOAD)))
    iso.setup()
    gc.collect()
    try:  # hand freed heap back: a smaller worker forks faster
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
    gc.freeze()  # keep the forked children from touching (copying) every object's GC header
    sessions = SessionTable(int(cfg.get("max_sessions", 64)), float(cfg.get("session_idle_s", 600)))
    zyg = Zygote(iso, Limits.from_dict(cfg.get("limits", {})), sessions)
    send_msg(
        wfd,
        {
            "op": "hello",
            "pid": os.getpid(),
            "layers": iso.report(),
            "preloaded": loaded,
            "cgroup": iso.cgroup.name if iso.cgroup else None,
            "root_dir": iso.root_dir,
        },
    )
    while True:
        msg = recv_msg(rfd)
        sessions.expire(time.monotonic())
        if msg is None or msg.get("op") == "exit":
            return 0
        if msg.get("op") == "run":
            try:
                result = zyg.run(msg)
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
