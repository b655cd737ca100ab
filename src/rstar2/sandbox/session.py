"""Stateful sessions: a live interpreter per `session_id`, forked before every cell.

Process tree of one session, inside its own PID namespace:

    init (root, reaps) ── holder H_k (uid of the worker; keeps the variables after k cells)
                              └── cell C_{k+1}: a fork of H_k that runs the next cell

If the cell finishes (even by raising), C_{k+1} becomes the holder: it tells H_k to exit and kills
whatever else the cell left running. If it crashes or times out, H_k kills it and stays: the session
is exactly as it was before that cell. A cell costs one fork whatever k is (the released rStar2 code
replays every earlier cell instead). The init is forked by the worker's full zygote; the worker talks to
the current holder over a SEQPACKET socket (``run_cell``), and keeps its live sessions in a
``SessionTable``.
"""

from __future__ import annotations

import builtins
import json
import os
import select
import signal
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from . import linux
from .capture import CallOutput
from .interpreter import run_code
from .isolation import WorkerIsolation, set_rlimits
from .outcome import INTERNAL_EXIT, to_result
from .request import Limits
from .result import ExecResult

_MAX_MSG = 1 << 20


# ----------------------------------------------------------------------------- inside the session
def _reap() -> None:
    """Wait for our children after kill(-1, SIGKILL): they are all dying, so this ends quickly."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def _send(sock: socket.socket, obj: dict) -> None:
    try:
        sock.send(json.dumps(obj).encode())
    except OSError:
        os._exit(0)


def holder_loop(sock: socket.socket, namespace: dict) -> None:
    """The holder's life: wait for a cell, fork it, and either hand over to it or outlive it."""
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, 4)
        except OSError:
            os._exit(0)
        if not msg:  # the worker closed the session
            os._exit(0)
        cmd = json.loads(msg)
        if cmd.get("op") != "cell" or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue  # e.g. a late "abort" for a cell that already finished
        seq = cmd["seq"]
        hand_r, hand_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # ------------------------------------------------ the cell
            os.close(hand_r)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            set_rlimits(Limits.from_dict(cmd["limits"]), strict=False)
            exit_code = run_code(cmd["code"], 3, namespace)
            null = os.open(os.devnull, os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(null, target)
            os.close(null)
            os.close(3)
            try:
                os.write(hand_w, b"1")  # take over: the old holder exits
            except OSError:
                pass  # the cell already killed the old holder
            os.close(hand_w)
            try:
                os.kill(-1, signal.SIGKILL)  # the old holder and anything the cell left running
            except OSError:
                pass
            _reap()
            _send(sock, {"seq": seq, "done": exit_code})
            continue  # this process is now the holder
        for fd in fds:
            os.close(fd)
        os.close(hand_w)
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        for fd in (hand_r, pidfd, sock.fileno()):
            poller.register(fd, select.POLLIN)
        outcome: dict | None = None
        while outcome is None:
            for fd, _ in poller.poll():
                if fd == hand_r and os.read(hand_r, 1):
                    os._exit(0)  # the cell took over
                if fd == pidfd:
                    _, status = os.waitpid(pid, 0)
                    outcome = {"seq": seq, "crashed": status}
                elif fd == sock.fileno():
                    try:
                        m, extra, _, _ = socket.recv_fds(sock, _MAX_MSG, 4)
                    except OSError:
                        m, extra = b"", []
                    for x in extra:
                        os.close(x)
                    if not m:
                        os._exit(0)
                    if json.loads(m).get("op") == "abort":
                        outcome = {"seq": seq, "aborted": True}
        try:
            os.kill(-1, signal.SIGKILL)  # the failed cell and everything it started
        except OSError:
            pass
        if "aborted" in outcome:
            try:
                _, status = os.waitpid(pid, 0)
                outcome["status"] = status
            except ChildProcessError:
                pass
        _reap()
        os.close(hand_r)
        os.close(pidfd)
        _send(sock, outcome)


def session_init(iso: WorkerIsolation, limits: Limits, sock: socket.socket) -> None:
    """The session's PID-namespace init: private /tmp, then the first holder; reaps until it is alone."""
    try:
        plan = iso.plan(limits)
        iso.enter_private_fs(plan)
        pid = os.fork()
        if pid == 0:
            iso.drop_privileges(plan)
            holder_loop(sock, {"__name__": "__main__", "__builtins__": builtins})
            os._exit(0)
        sock.close()
        while True:
            try:
                os.wait()
            except ChildProcessError:
                os._exit(0)
    except BaseException:  # noqa: BLE001
        os._exit(INTERNAL_EXIT)


# ----------------------------------------------------------------------------- in the worker
@dataclass
class SessionHandle:
    session_id: str
    pidfd: int
    sock: socket.socket
    last_used: float
    seq: int = 0
    cells: int = 0

    def close(self) -> None:
        """Kill the session's init (the whole namespace goes with it); its zygote reaps it."""
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.sock.close()
        os.close(self.pidfd)


class SessionTable:
    """Live sessions of one worker: idle expiry, LRU eviction, a cap, and memory of what expired."""

    def __init__(self, max_sessions: int = 64, idle_s: float = 600.0) -> None:
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self.live: OrderedDict[str, SessionHandle] = OrderedDict()
        self.gone: OrderedDict[str, str] = OrderedDict()  # id -> why it ended (bounded)

    def forget(self, session_id: str, why: str) -> None:
        handle = self.live.pop(session_id, None)
        if handle is not None:
            handle.close()
        self.gone[session_id] = why
        while len(self.gone) > 100_000:
            self.gone.popitem(last=False)

    def expire(self, now: float) -> None:
        for sid, handle in list(self.live.items()):
            if now - handle.last_used > self.idle_s:
                self.forget(sid, f"expired after {self.idle_s:g} s idle")

    def make_room(self) -> None:
        while len(self.live) >= self.max_sessions:
            sid = next(iter(self.live))
            self.forget(
                sid, f"evicted (least recently used; at most {self.max_sessions} live sessions per worker)"
            )

    def add(self, handle: SessionHandle) -> None:
        self.live[handle.session_id] = handle

    def touch(self, session_id: str) -> SessionHandle | None:
        handle = self.live.get(session_id)
        if handle is not None:
            handle.last_used = time.monotonic()
            self.live.move_to_end(session_id)
        return handle


def run_cell(
    table: SessionTable,
    iso: WorkerIsolation,
    req: dict,
    limits: Limits,
    start: Callable[[str, Limits], SessionHandle],
) -> ExecResult:
    """Run one cell of the session ``req["session_id"]`` (started with `start` when new), watching
    its output and wall clock; an over-limit cell is aborted by its holder, which restores the
    session to its state before the cell."""
    sid = req["session_id"]
    table.expire(time.monotonic())
    handle = table.touch(sid)
    if handle is None:
        if sid in table.gone:
            return ExecResult.failure("rejected", f"session {sid!r} {table.gone[sid]}; use a new session_id")
        if iso.pid_ns_fd is None:
            return ExecResult.failure("rejected", "stateful sessions need PID namespaces, unavailable here")
        table.make_room()
        try:
            handle = start(sid, limits)
        except OSError as exc:
            return ExecResult.failure("internal", f"could not start session: {exc}")
        table.add(handle)
    t0 = time.monotonic()
    stdin_fd = linux.memfd_with("stdin", (req.get("input") or "").encode("utf-8", "surrogateescape"))
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    handle.seq += 1
    cmd = {"op": "cell", "seq": handle.seq, "code": req["code"], "limits": limits.to_dict()}
    iso.prepare_call(limits)
    cg = iso.cgroup
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
    output = CallOutput(limits.output_bytes, limits.max_output_mb, out_r, err_r, res_r)
    poller = select.poll()
    for fd in (*output.streams, handle.sock.fileno(), handle.pidfd):
        poller.register(fd, select.POLLIN)
    open_fds = set(output.streams)
    deadline = t0 + limits.timeout_s
    killed: str | None = None
    outcome: dict | None = None
    lost = False
    abort_sent_at: float | None = None

    def abort() -> bool:
        """Ask the holder to kill the running cell and stay as it was; False if it is gone."""
        try:
            handle.sock.send(json.dumps({"op": "abort", "seq": handle.seq}).encode())
            return True
        except OSError:
            return False

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
            if wait <= 0 or (killed is None and output.over_limit):
                killed = killed or ("timeout" if wait <= 0 else "output_limit")
                abort_sent_at = now
                lost = not abort()
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
                    msg = handle.sock.recv(_MAX_MSG)
                except OSError:
                    msg = b""
                if not msg:
                    lost = True
                    poller.unregister(fd)
                    continue
                reply = json.loads(msg)
                if reply.get("seq") == handle.seq:
                    outcome = reply
            elif output.read(fd):
                if killed is None and output.over_limit:
                    killed = "output_limit"
                    abort_sent_at = time.monotonic()
                    lost = not abort()
            else:
                poller.unregister(fd)
                open_fds.discard(fd)
    output.close()
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
    result = to_result(limits, duration, output, wstatus, killed, oom, None)
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
