"""Stateful sessions: a live interpreter per `session_id`, forked before every cell.

Process tree of one session, inside its own PID namespace:

    init (root, reaps) ── holder H_k (uid of the worker; keeps the variables after k cells)
                              └── cell C_{k+1}: a fork of H_k that runs the next cell

If the cell finishes (even by raising), C_{k+1} becomes the holder: it tells H_k to exit and kills
whatever else the cell left running. If it crashes or times out, H_k kills it and stays: the session
is exactly as it was before that cell. A cell costs one fork whatever k is: no earlier cell is
replayed. The full zygote forks the init; the worker talks to the holder over a SEQPACKET socket.
"""

from __future__ import annotations

import builtins
import contextlib
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
from .isolation import WorkerIsolation, apply_rlimits, rlimit_values
from .outcome import INTERNAL_EXIT, to_result
from .request import Limits
from .result import ExecResult

_MAX_MSG = 1 << 20


# ----------------------------------------------------------------------------- inside the session
def _reap() -> None:
    """Wait for our children after kill(-1, SIGKILL): they are all dying, so this ends quickly."""
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)


def _kill_all_others() -> None:
    """SIGKILL every process of the session's namespace but this one (and its init, immune to it)."""
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)


def _send(sock: socket.socket, obj: dict) -> None:
    try:
        sock.send(json.dumps(obj).encode())
    except OSError:
        os._exit(0)


def holder_loop(sock: socket.socket, namespace: dict) -> None:
    """The holder's life: wait for a cell, fork it, and either hand over to it or outlive it."""
    while True:
        cmd, fds = _next_cell(sock)
        handover_r, handover_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(handover_r)
            _run_cell_and_take_over(sock, cmd, fds, handover_w, namespace)
            continue  # this process is now the holder
        for fd in fds:
            os.close(fd)
        os.close(handover_w)
        outcome = _outlive_cell(sock, pid, handover_r, cmd["seq"])
        os.close(handover_r)
        _send(sock, outcome)


def _recv(sock: socket.socket) -> tuple[dict, list[int]]:
    """The worker's next message and its descriptors; exits when the worker closed the session."""
    try:
        msg, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, 4)
    except OSError:
        os._exit(0)
    if not msg:
        os._exit(0)
    return json.loads(msg), fds


def _next_cell(sock: socket.socket) -> tuple[dict, list[int]]:
    """The worker's next cell and its four descriptors (stdin, stdout, stderr, report pipe)."""
    while True:
        cmd, fds = _recv(sock)
        if cmd.get("op") == "cell" and len(fds) == 4:
            return cmd, fds
        for fd in fds:  # e.g. a late "abort" for a cell that already finished
            os.close(fd)


def _run_cell_and_take_over(
    sock: socket.socket, cmd: dict, fds: list[int], handover_w: int, namespace: dict
) -> None:
    """In the forked cell: run the code; then, having finished (even by raising), become the holder:
    the old holder and whatever the cell left running are killed."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    apply_rlimits(rlimit_values(Limits.from_dict(cmd["limits"])), strict=False)
    exit_code = run_code(cmd["code"], 3, namespace)
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)
    os.close(3)
    with contextlib.suppress(OSError):  # OSError: the cell already killed the old holder
        os.write(handover_w, b"1")  # take over: the old holder exits
    os.close(handover_w)
    _kill_all_others()
    _reap()
    _send(sock, {"seq": cmd["seq"], "done": exit_code})


def _outlive_cell(sock: socket.socket, pid: int, handover_r: int, seq: int) -> dict:
    """While the cell `pid` runs: exit if it takes over. If it crashes, or the worker aborts it, kill it
    and all it started, and return what to tell the worker; this holder stays, as before the cell."""
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    for fd in (handover_r, pidfd, sock.fileno()):
        poller.register(fd, select.POLLIN)
    outcome: dict | None = None
    while outcome is None:
        for fd, _ in poller.poll():
            if fd == handover_r and os.read(handover_r, 1):
                os._exit(0)  # the cell took over
            if fd == pidfd:
                _, status = os.waitpid(pid, 0)
                outcome = {"seq": seq, "crashed": status}
            elif fd == sock.fileno() and _abort_asked(sock):
                outcome = {"seq": seq, "aborted": True}
    _kill_all_others()  # the failed cell and everything it started
    if "aborted" in outcome:
        with contextlib.suppress(ChildProcessError):
            outcome["status"] = os.waitpid(pid, 0)[1]
    _reap()
    os.close(pidfd)
    return outcome


def _abort_asked(sock: socket.socket) -> bool:
    """Read the worker's message while a cell runs: whether it asks to abort."""
    cmd, fds = _recv(sock)
    for fd in fds:
        os.close(fd)
    return cmd.get("op") == "abort"


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
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        self.sock.close()
        os.close(self.pidfd)


class SessionTable:
    """Live sessions of one worker: idle expiry, LRU eviction, a cap, and memory of what expired."""

    def __init__(self, max_sessions: int, idle_s: float) -> None:
        self.max_sessions, self.idle_s = max_sessions, idle_s
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
        why = f"evicted (least recently used; at most {self.max_sessions} live sessions per worker)"
        while len(self.live) >= self.max_sessions:
            self.forget(next(iter(self.live)), why)

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
        table.live[sid] = handle
    t0 = time.monotonic()
    try:
        output = _send_cell(handle, req, limits, iso)
    except OSError as exc:
        table.forget(sid, "was lost")
        return ExecResult.failure("internal", f"session {sid!r} was lost ({exc}); use a new session_id")
    cell = _CellWatch(handle, output, t0 + limits.timeout_s)
    cell.watch()
    oom = iso.cgroup is not None and iso.cgroup.new_oom_kills() > 0
    result = cell.result(limits, time.monotonic() - t0, oom)
    if cell.lost:
        table.forget(sid, "was lost (its process died)")
    return result


def _send_cell(handle: SessionHandle, req: dict, limits: Limits, iso: WorkerIsolation) -> CallOutput:
    """Hand the session's holder the next cell with its stdin and three fresh pipes, and capture
    their reading ends. OSError: the holder is gone."""
    stdin_fd = linux.memfd_with("stdin", (req.get("input") or "").encode("utf-8", "surrogateescape"))
    output = CallOutput(limits)
    handle.seq += 1
    cmd = {"op": "cell", "seq": handle.seq, "code": req["code"], "limits": limits.to_dict()}
    iso.prepare_call(limits)
    if iso.cgroup is not None:
        iso.cgroup.new_oom_kills()  # forget kills from before this cell
    theirs = [stdin_fd, *output.writing_ends]
    try:
        socket.send_fds(handle.sock, [json.dumps(cmd).encode()], theirs)
    except OSError:
        output.close()
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return output


class _CellWatch:
    """One running cell, seen from the worker: its output, its wall clock and its holder's reply.
    Over a limit, the holder is asked to abort the cell; a holder that dies, or does not answer
    within `ABORT_GRACE_S`, loses the session."""

    ABORT_GRACE_S = 2.0
    DRAIN_S = 0.2  # after the reply: how long to wait for what is left in the pipes

    def __init__(self, handle: SessionHandle, output: CallOutput, deadline: float) -> None:
        self.handle, self.output, self.deadline = handle, output, deadline
        self.killed: str | None = None  # "timeout" or "output_limit" once we asked for an abort
        self.abort_sent_at: float | None = None
        self.outcome: dict | None = None  # the holder's reply: done, crashed or aborted
        self.lost = False  # the session's processes are gone
        self.open_fds = set(output.streams)
        self.poller = select.poll()
        for fd in (*output.streams, handle.sock.fileno(), handle.pidfd):
            self.poller.register(fd, select.POLLIN)

    def watch(self) -> None:
        while (self.outcome is None and not self.lost) or self.open_fds:
            now = time.monotonic()
            if self.outcome is not None or self.lost:
                wait = self.DRAIN_S
            elif self.abort_sent_at is not None:
                wait = self.abort_sent_at + self.ABORT_GRACE_S - now
                if wait <= 0:  # the holder does not answer: give the whole session up
                    self.lost = True
                    break
            else:
                wait = self.deadline - now
                if wait <= 0:  # (over the output limit, `_on_ready` has asked for an abort already)
                    self._abort("timeout")
                    continue
            events = self.poller.poll(max(0.0, wait) * 1000)
            if not events and (self.outcome is not None or self.lost):
                break
            for fd, _ in events:
                self._on_ready(fd)
        self.output.close()
        if self.outcome is None:
            self.lost = True

    def _on_ready(self, fd: int) -> None:
        if fd == self.handle.pidfd:
            self.lost = True
            self.poller.unregister(fd)
        elif fd == self.handle.sock.fileno():
            self._read_reply()
        elif self.output.read(fd):
            if self.killed is None and self.output.over_limit:
                self._abort("output_limit")
        else:
            self.poller.unregister(fd)
            self.open_fds.discard(fd)

    def _read_reply(self) -> None:
        try:
            msg = self.handle.sock.recv(_MAX_MSG)
        except OSError:
            msg = b""
        if not msg:
            self.lost = True
            self.poller.unregister(self.handle.sock.fileno())
            return
        reply = json.loads(msg)
        if reply.get("seq") == self.handle.seq:
            self.outcome = reply

    def _abort(self, why: str) -> None:
        """Ask the holder to kill the running cell and stay as it was; the session is lost if it is gone."""
        self.killed = why
        self.abort_sent_at = time.monotonic()
        try:
            self.handle.sock.send(json.dumps({"op": "abort", "seq": self.handle.seq}).encode())
        except OSError:
            self.lost = True

    def result(self, limits: Limits, duration: float, oom: bool) -> ExecResult:
        outcome = self.outcome or {}
        done = "done" in outcome
        wstatus = outcome.get("crashed", outcome.get("status"))  # the holder's wait status of the cell
        if done:
            wstatus = (int(outcome["done"]) & 0xFF) << 8
            self.handle.cells += 1
        killed = None if done else self.killed  # finished just as the limit struck: keep its result
        result = to_result(limits, duration, self.output, wstatus, killed, oom, None)
        sid = self.handle.session_id
        if self.lost:
            _add_reason(result, f"session {sid!r} was lost and has been closed; use a new session_id")
            if result.status == "ok":
                result.status = "error"
        elif not done:
            _add_reason(result, "the session was restored to its state before this cell")
        result.extra = {"session_id": sid, "cells": self.handle.cells}
        return result


def _add_reason(result: ExecResult, note: str) -> None:
    result.reason = f"{result.reason}; {note}" if result.reason else note
