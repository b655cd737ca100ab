"""A zygote: a pre-warmed process that does nothing but fork one fresh child per call; and
``ZygoteHandle``, the worker's side of it (start, ask for a child, read how it ended, restart).

Between forks a zygote does as little as it can, since every page a process writes after a fork must
be copied (the worker's bookkeeping would write hundreds): it receives a call's descriptors, forks,
hands back the child's pidfd, waits for the child and reports how it ended. The child reads its code
from a memfd, enters the per-call isolation layers (planned once per distinct set of limits), runs it.

Protocol on the SEQPACKET socket to the worker (one call at a time):

    worker -> zygote   b"c" + limits JSON + NUL + temp dir, with fds            run a call
                           [code, stdin, stdout, stderr, result]
                       b"s" + limits JSON, with fds [session socket]             start a session
    zygote -> worker   b"p" + pid with fds [pidfd]                               the child exists
                       b"x" + pid, wait status, CPU seconds                      a call's child ended
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
from collections.abc import Callable

from . import linux
from .cgroups import reap_ready
from .interpreter import fresh_stdio, run_code
from .isolation import CallPlan, WorkerIsolation, safe_environment
from .outcome import INTERNAL_EXIT
from .request import Limits
from .session import session_init

# What a worker imports once, unless told otherwise
PRELOAD = tuple(
    "math cmath fractions decimal itertools collections functools re random statistics heapq bisect "
    "string json numpy sympy".split()
)
START_S = 120.0  # importing numpy and sympy on a loaded machine can take long
PID = struct.Struct("!i")
ENDED = struct.Struct("!iid")  # pid, wait status, CPU seconds (user + system)
_MAX_MSG = 1 << 16


def preload(modules: list[str]) -> list[str]:
    """Import what calls will likely use, and warm the caches that make a first use slow."""
    loaded = []
    for name in modules:
        try:
            module = importlib.import_module(name)
            loaded.append(name)
        except Exception:  # noqa: BLE001 - optional modules
            continue
        warm_up = getattr(module, "warm_up", None)
        if name.startswith("rstar2.") and callable(warm_up):  # e.g. the verifier's CAS caches
            with contextlib.suppress(Exception):
                warm_up()
    if "sympy" in loaded:  # warm sympy's lazy caches with a typical call
        with contextlib.suppress(Exception):
            import sympy

            sympy.solve(sympy.Symbol("x") ** 2 - 1)
    return loaded


def serve(
    sock: socket.socket, iso: WorkerIsolation, modules: list[str], defaults: Limits, proc_fd: int | None
) -> None:
    """The zygote's life (never returns): warm up, say hello, then fork one child per request."""
    try:
        sock.send(json.dumps(_get_ready(iso, modules, defaults, proc_fd)).encode())
    except BaseException:  # noqa: BLE001 - the worker sees the closed socket
        os._exit(INTERNAL_EXIT)

    @functools.lru_cache(maxsize=64)
    def plan_for(limits_json: bytes) -> CallPlan:  # worked out once per distinct set of limits
        return iso.plan(Limits.from_dict(json.loads(limits_json)))

    has_sessions = False
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, 8)
        except OSError:
            os._exit(0)
        if not msg:  # the worker is gone or closed us
            os._exit(0)
        if has_sessions:
            reap_ready()  # sessions that ended since the last request
        if msg[:1] == b"c" and len(fds) == 5:
            limits_json, _, tmp_dir = msg[1:].partition(b"\0")
            _fork_call(sock, iso, plan_for(limits_json), fds, tmp_dir.decode() or None)
        elif msg[:1] == b"s" and len(fds) == 1:
            has_sessions = True
            _fork_session(sock, iso, Limits.from_dict(json.loads(msg[1:])), fds[0])
        else:
            for fd in fds:
                os.close(fd)
            sock.send(b"p" + PID.pack(-1))


def _get_ready(iso: WorkerIsolation, modules: list[str], defaults: Limits, proc_fd: int | None) -> dict:
    """Import and warm up, then make this process as cheap to fork as it can be; returns the hello."""
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    loaded = preload(modules)
    iso.zygote_setup(defaults)
    huge_pages = os.environ.get("RSTAR2_HUGE_PAGES", "1") != "0"
    safe_environment()
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # hand freed heap back: a smaller zygote forks faster
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    gc.freeze()  # keep the children from touching (copying) every object's GC header
    huge = 0
    if proc_fd is not None:
        huge = _collapse(proc_fd) if huge_pages else 0
        os.close(proc_fd)
    fresh_stdio()  # last: nothing may write to these streams before a child inherits them
    top_level = sorted({name.partition(".")[0] for name in sys.modules})
    return {"preloaded": loaded, "modules": top_level, "huge_mb": huge >> 20}


def _fork(
    sock: socket.socket, iso: WorkerIsolation, fds: list[int], child: Callable[..., None], *args: object
) -> tuple[int, int] | None:
    """Fork `child` (which never returns) as the init of a fresh PID namespace and hand its pidfd to
    the worker. Returns (pid, pidfd), or None when fork failed (the worker was told; `fds` closed)."""
    iso.before_fork()
    try:
        pid = os.fork()
    except OSError:
        pid = -1
    if pid == 0:
        child(*args)
    if pid < 0:
        iso.after_fork()
        for fd in fds:
            os.close(fd)
        sock.send(b"p" + PID.pack(-1))
        return None
    pidfd = os.pidfd_open(pid)
    socket.send_fds(sock, [b"p" + PID.pack(pid)], [pidfd])
    return pid, pidfd


def _fork_call(
    sock: socket.socket, iso: WorkerIsolation, plan: CallPlan, fds: list[int], tmp_dir: str | None
) -> None:
    forked = _fork(sock, iso, fds, _child, iso, plan, fds, tmp_dir)
    if forked is None:
        return
    pid, pidfd = forked
    # As little as possible while the child lives: each page written now is copied (the child still
    # shares it); after the child's end the same writes only re-enable the page.
    _, status, usage = os.wait4(pid, 0)
    iso.after_fork()
    for fd in (*fds, pidfd):
        os.close(fd)
    sock.send(b"x" + ENDED.pack(pid, status, usage.ru_utime + usage.ru_stime))


def _child(iso: WorkerIsolation, plan: CallPlan, fds: list[int], tmp_dir: str | None) -> None:
    """A call's process: fds become 0-3, isolation layers on, then the code. Never returns."""
    try:
        code_fd = fds[0]  # read before fd 3 is replaced: it may be fd 3
        code = os.pread(code_fd, os.fstat(code_fd).st_size, 0).decode("utf-8", "surrogateescape")
        for target, fd in enumerate(fds[1:]):
            os.dup2(fd, target)
        os.closerange(4, 1 << 16)
        iso.enter_private_fs(plan, tmp_dir)
        iso.drop_privileges(plan, tmp_dir)
    except BaseException as exc:  # noqa: BLE001 - never run code half-isolated
        try:
            os.write(3, json.dumps({"internal": f"isolation set-up failed: {exc!r}"}).encode())
        finally:
            os._exit(INTERNAL_EXIT)
    try:
        status = run_code(code, 3, new_stdio=False)
    except BaseException:  # noqa: BLE001
        status = 1
    os._exit(status)


def _fork_session(sock: socket.socket, iso: WorkerIsolation, limits: Limits, theirs: int) -> None:
    def init() -> None:
        try:
            null = os.open(os.devnull, os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(null, target)
            ctl = fcntl.fcntl(theirs, fcntl.F_DUPFD, 10)  # clear of fds 0-3, which every cell replaces
            linux.close_fds_except({ctl})
            session_init(iso, limits, socket.socket(fileno=ctl))
        finally:
            os._exit(INTERNAL_EXIT)

    forked = _fork(sock, iso, [theirs], init)
    if forked is not None:
        iso.after_fork()
        os.close(theirs)
        os.close(forked[1])


def _collapse(proc_fd: int) -> int:
    """Huge pages for the zygote's heap, which it no longer writes (see `linux.collapse_anonymous_memory`)."""
    try:
        fd = os.open(f"{os.getpid()}/maps", os.O_RDONLY, dir_fd=proc_fd)
    except OSError:
        return 0
    with open(fd, "rb") as fh:
        return linux.collapse_anonymous_memory(fh.read().decode())


# ----------------------------------------------------------------------------- in the worker
class ZygoteLost(RuntimeError):
    """A zygote died or broke the protocol; a new one is started for the next call."""


class ZygoteHandle:
    """The worker's side of one zygote: starts it, asks it to fork, restarts it when it died."""

    def __init__(
        self, name: str, modules: list[str], iso: WorkerIsolation, defaults: Limits, proc_fd: int | None
    ) -> None:
        self.name, self.modules = name, modules
        self.iso, self.defaults, self.proc_fd = iso, defaults, proc_fd
        self.pid = 0
        self.pidfd: int | None = None
        self.sock: socket.socket | None = None
        self.hello: dict = {}
        self.loaded: frozenset[str] = frozenset()  # top-level names of every module it has imported

    def start(self) -> None:
        self.stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                keep = {theirs.fileno(), *(fd for fd in (self.proc_fd, self.iso.pid_ns_fd) if fd is not None)}
                linux.close_fds_except(keep)
                serve(theirs, self.iso, self.modules, self.defaults, self.proc_fd)
            finally:
                os._exit(INTERNAL_EXIT)
        theirs.close()
        self.pid, self.sock, self.pidfd = pid, ours, os.pidfd_open(pid)
        ready, _, _ = select.select([ours], [], [], START_S)
        msg = ours.recv(_MAX_MSG) if ready else b""
        if not msg:
            self.stop()
            raise ZygoteLost(f"the {self.name} zygote failed to start")
        self.hello = json.loads(msg)
        self.loaded = frozenset(self.hello.get("modules", []))

    def stop(self) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            os.close(self.pidfd)
        if self.sock is not None:
            self.sock.close()
        self.pidfd, self.sock = None, None

    def fork(self, header: bytes, fds: list[int]) -> tuple[int, int | None]:
        """Send a request; returns (pid, pidfd) of the new child, or (-1, None) if fork failed. A zygote
        not running (never started, or found dead since) is started afresh, and one that dies on this
        request is started and asked once more; ``ZygoteLost`` if that fails too."""
        if self.sock is None:
            self.start()
        try:
            return self._ask(header, fds)
        except ZygoteLost:
            self.start()
            return self._ask(header, fds)

    def _ask(self, header: bytes, fds: list[int]) -> tuple[int, int | None]:
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

    def ended(self, pid: int) -> tuple[int, float] | None:
        """Read the zygote's report that the call's child `pid` ended: (wait status, CPU seconds);
        None when it died (it is then stopped and starts afresh on the next call)."""
        assert self.sock is not None
        try:
            msg = self.sock.recv(64)
        except OSError:
            msg = b""
        if len(msg) != 1 + ENDED.size or msg[:1] != b"x":
            self.stop()  # it died (or broke the protocol)
            return None
        ended_pid, status, cpu = ENDED.unpack(msg[1:])
        return (status, cpu) if ended_pid == pid else None
