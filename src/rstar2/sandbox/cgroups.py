"""The cgroup layer of the sandbox: a cgroup v1 memory + pids pair per worker, in which the worker
and its calls live (the memory and process caps of a call, and its OOM kills counted), and the
clean-up after a worker exits."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from .request import Limits

CGROUP_ROOT = "/sys/fs/cgroup"
MEMORY_SLACK = 4 << 20  # a call's memory cap may be this far off its budget (saves a write per call)


def write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def reap_ready() -> None:
    """Reap children that have ended: without a PID namespace the worker is the subreaper of its
    calls' orphans, which would otherwise stay zombies (they are no longer in any cgroup list)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


class CgroupPair:
    """A cgroup v1 memory + pids pair for one worker; the worker and its calls live in it."""

    def __init__(self, name: str) -> None:
        self.name = name
        mem_dir = os.path.join(CGROUP_ROOT, "memory", "rstar2", name)
        pids_dir = os.path.join(CGROUP_ROOT, "pids", "rstar2", name)
        os.makedirs(mem_dir, exist_ok=True)
        os.makedirs(pids_dir, exist_ok=True)
        for d in (mem_dir, pids_dir):
            write(os.path.join(d, "cgroup.procs"), str(os.getpid()))
        # the cgroup's OOM killer should pick a call, never the worker (calls also raise theirs to 1000)
        with contextlib.suppress(OSError):
            write("/proc/self/oom_score_adj", "-1000")
        self._limit_fd = os.open(os.path.join(mem_dir, "memory.limit_in_bytes"), os.O_WRONLY)
        self._usage_fd = os.open(os.path.join(mem_dir, "memory.usage_in_bytes"), os.O_RDONLY)
        self._oom_fd = os.open(os.path.join(mem_dir, "memory.oom_control"), os.O_RDONLY)
        self._pids_fd = os.open(os.path.join(pids_dir, "pids.max"), os.O_WRONLY)
        self._pids_current_fd = os.open(os.path.join(pids_dir, "pids.current"), os.O_RDONLY)
        # The directory is opened now (the filesystem layer later hides /sys from the worker's own
        # view); cgroup.procs is opened afresh under it for each read: cgroup v1 keeps the pid list
        # of an open file for a second, so re-reading one open file can miss a new process.
        self._pids_dir_fd = os.open(pids_dir, os.O_RDONLY | os.O_DIRECTORY)
        self._mem_written = self._pids_written = -(1 << 62)
        self._oom_seen = self.oom_kills()

    def _read(self, fd: int) -> str:
        return os.pread(fd, 4096, 0).decode()

    def kill_all_but(self, keep: set[int]) -> None:
        """Without a PID namespace: kill every process of the call that is still in our cgroup."""
        for _ in range(100):
            reap_ready()
            with open(os.open("cgroup.procs", os.O_RDONLY, dir_fd=self._pids_dir_fd)) as fh:
                pids = [int(x) for x in fh.read().split() if int(x) not in keep]
            if not pids:
                return
            _kill_each(pids)
            for pid in pids:  # the worker is their subreaper: reap each (a non-child raises)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)

    def oom_kills(self) -> int:
        for line in self._read(self._oom_fd).splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def set_limits(self, limits: Limits) -> None:
        """Memory: what the worker and its live sessions hold now, plus this call's budget (its
        address space and its /tmp); pids: the worker, its sessions and this call's processes.
        A limit is rewritten only when it moved (memory: by more than `MEMORY_SLACK`)."""
        base = int(self._read(self._usage_fd))
        mem = base + (limits.memory_mb + limits.tmp_mb) * 1024 * 1024
        pids = int(self._read(self._pids_current_fd)) + limits.max_processes + 1
        try:
            if abs(mem - self._mem_written) > MEMORY_SLACK:
                os.pwrite(self._limit_fd, str(mem).encode(), 0)
                self._mem_written = mem
            if pids != self._pids_written:
                os.pwrite(self._pids_fd, str(pids).encode(), 0)
                self._pids_written = pids
        except OSError:
            self._mem_written = self._pids_written = -(1 << 62)

    def new_oom_kills(self) -> int:
        """OOM kills in this cgroup since the previous look (the worker looks after every call)."""
        count = self.oom_kills()
        new, self._oom_seen = count - self._oom_seen, count
        return new


def _kill_each(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def remove_cgroups(name: str) -> None:
    """Called by the parent after a worker exited: kill what is left in its cgroup, then remove it."""
    procs = os.path.join(CGROUP_ROOT, "pids", "rstar2", name, "cgroup.procs")
    for _ in range(200):
        try:
            with open(procs) as fh:
                pids = [int(x) for x in fh.read().split()]
        except OSError:
            break
        if not pids:
            break
        _kill_each(pids)
        time.sleep(0.01)
    for ctrl in ("memory", "pids"):
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(CGROUP_ROOT, ctrl, "rstar2", name))
