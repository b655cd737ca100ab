"""The checking processes behind ``VerifierPool``.

``python -m rstar2.reward.checker FD`` starts a *template*: it imports sympy and math-verify,
warms their caches, then forks one checker per request and hands the parent a socket to it
(SCM_RIGHTS). A replacement checker therefore costs a fork, not a 2-second import, and no
part of the caller's ``__main__`` is ever re-imported (the trap of multiprocessing's
spawn/forkserver modes in scripts without a ``__main__`` guard).
"""

from __future__ import annotations

import gc
import os
import resource
import signal
import socket
import sys
from multiprocessing.connection import Connection

from .guards import MEMORY_CAP_REASON


def _die_with_parent() -> None:
    from ..sandbox import linux

    try:
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the EOF on the socket ends the process instead
        pass


def serve_checks(conn: Connection, memory_mb: int) -> None:
    """A checker: receive (reference, answer), send a verdict dict, until EOF."""
    from .equivalence import Verdict, check_answer, warm_up

    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:  # touch the CAS once more: the fork's copy-on-write faults are paid before the time box
        warm_up()
    except Exception:  # noqa: BLE001
        pass
    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        reference, answer = task
        try:
            conn.send(check_answer(reference, answer).to_dict())
        except MemoryError:
            conn.send(Verdict(False, MEMORY_CAP_REASON, answer, "error").to_dict())
            return  # a checker that ran out of memory is replaced


def template(control: socket.socket) -> None:
    from .equivalence import warm_up

    # no PDEATHSIG here: it would fire when the *thread* that started us ends; the template
    # leaves when its control socket reaches EOF (the owner closed it or died)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # checkers are reaped by the kernel
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        warm_up()
    except Exception:  # noqa: BLE001 - a broken CAS shows in the checks themselves
        pass
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
            _die_with_parent()
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
