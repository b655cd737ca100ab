"""The checking processes behind ``VerifierPool``: ``python -m rstar2.reward.checker FD`` starts a
template that warms the CAS, then forks one checker per request and hands the parent a socket to it.
A replacement costs a fork, not a 2-second import, and the caller's ``__main__`` is never
re-imported (the trap of multiprocessing's spawn/forkserver modes)."""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import signal
import socket
import sys
from multiprocessing.connection import Connection

from ..sandbox import linux
from .equivalence import Verdict, check_answer, warm_up
from .guards import MEMORY_CAP_REASON


def check_task(gym: dict, answer: str) -> Verdict:
    """A reasoning-gym task's own scorer on ``answer``: correct only at full marks. A scorer that
    raises on the answer scores it wrong; one that cannot be loaded is the verifier's fault."""
    from ..gym import task_score

    try:
        score = task_score(gym, answer)
    except ImportError as exc:
        return Verdict(False, str(exc), answer, "error")
    except Exception as exc:  # noqa: BLE001 -- third-party code on model-written text
        return Verdict(False, f"{gym['task']}'s scorer raised {type(exc).__name__}: {exc}", answer, "task")
    return Verdict(score >= 1.0, f"{gym['task']}'s scorer gave {score:g}", answer, "task")


def serve_checks(conn: Connection, memory_mb: int) -> None:
    """A checker: receive (reference, answer, gym), send a verdict dict, until EOF."""
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # touch the CAS once more: the fork's copy-on-write faults are paid before the time box
    with contextlib.suppress(Exception):
        warm_up()
    conn.send("ready")
    while True:
        try:
            reference, answer, gym = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send((check_task(gym, answer) if gym else check_answer(reference, answer)).to_dict())
        except MemoryError:
            conn.send(Verdict(False, MEMORY_CAP_REASON, answer, "error").to_dict())
            return  # a checker that ran out of memory is replaced


def template(control: socket.socket) -> None:
    # no PDEATHSIG here: it would fire when the *thread* that started us ends; the template
    # leaves when its control socket reaches EOF (the owner closed it or died)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # checkers are reaped by the kernel
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(Exception):  # a broken CAS shows in the checks themselves
        warm_up()
    gc.freeze()  # keep the collector from touching (and copying) the template's pages in checkers
    control.sendall(b"R")
    while True:
        request = control.recv(64)
        if not request:
            return
        memory_mb = int(request.decode())
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            control.close()
            ours.close()
            with contextlib.suppress(OSError, AttributeError):  # not Linux: the socket's EOF ends it instead
                linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
            code = 0
            try:
                serve_checks(Connection(theirs.detach()), memory_mb)
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        theirs.close()
        socket.send_fds(control, [str(pid).encode()], [ours.fileno()])
        ours.close()


if __name__ == "__main__":
    template(socket.socket(fileno=int(sys.argv[1])))
