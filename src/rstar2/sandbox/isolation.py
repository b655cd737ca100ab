"""The isolation layers: what a worker sets up once, and what each call's child applies.

Each layer is tried and reported (`rstar2 sandbox info`; docs/sandbox.md's table says what each does); one
the machine does not allow is skipped and the others still hold. Beyond that table: when not root, an
unprivileged user namespace (``user_ns``) allows the others; the network namespace has not even
loopback up; the private root has no /sys and no host /tmp; IPC and hostname are private (``ipc_uts``).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import linux
from .cgroups import CgroupPair, write
from .request import Limits

SAFE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}

_ZYGOTE_RLIMITS = (resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE, resource.RLIMIT_CORE)  # cannot hurt it
UID_BASE = 61000  # worker k runs calls as uid UID_BASE + k (unused range on Debian)


@dataclass
class IsolationConfig:
    """Which layers to try. `enabled=False` runs calls as plain forked children (for comparison only)."""

    enabled: bool = True
    network: bool = True
    pid: bool = True
    filesystem: bool = True
    cgroups: bool = True
    drop_uid: bool = True
    seccomp: bool = True

    @classmethod
    def from_dict(cls, data: dict) -> IsolationConfig:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class CallPlan:
    """What a call's child applies, worked out once per distinct `Limits` in the zygote: the child,
    every page of which it writes is a copy, then does little but the system calls themselves."""

    rlimits: tuple[tuple[int, int], ...]  # (resource, value) not already in force in the zygote
    tmp_options: bytes  # mount options of the call's /tmp


@dataclass
class WorkerIsolation:
    """The state a worker keeps after its one-time set-up; its zygotes inherit it and apply the
    per-call layers in each forked child (`enter_private_fs`, then `drop_privileges`)."""

    config: IsolationConfig
    worker_index: int
    layers: dict[str, dict] = field(default_factory=dict)  # name -> {name, active, detail}
    pid_ns_fd: int | None = None
    seccomp_program: linux.SeccompProgram | None = None
    uid: int | None = None
    cgroup: CgroupPair | None = None
    fs_ready: bool = False
    root_dir: str | None = None
    in_force: dict[int, int] = field(default_factory=dict)  # rlimits a zygote set on itself

    def note(self, name: str, active: bool, detail: str) -> None:
        self.layers[name] = {"name": name, "active": active, "detail": detail}

    # ---------------------------------------------------------------- once per worker
    def setup(self) -> None:
        """Try each layer in turn and note what became of it (the order is `rstar2 sandbox info`'s)."""
        cfg = self.config
        if not cfg.enabled:
            self.note("all", False, "isolation disabled by configuration")
            return
        is_root = os.geteuid() == 0
        if cfg.cgroups:
            self._join_cgroup(is_root)
        flags = self._enter_namespaces(is_root)
        self._probe_pid_namespace(flags)
        if cfg.seccomp:
            try:
                program = _seccomp_program()
                self.seccomp_program = linux.SeccompProgram(program)
                self.note("seccomp", True, f"deny-list filter, {len(program) // 8} BPF instructions")
            except Exception as exc:  # noqa: BLE001 - libseccomp missing or unsupported arch
                self.note("seccomp", False, f"unavailable: {exc}")
        self._build_private_root(flags)
        if cfg.drop_uid and is_root:
            self.uid = UID_BASE + self.worker_index
            self.note("uid", True, f"calls run as uid/gid {self.uid}, no capabilities")
        elif cfg.drop_uid:
            self.note("uid", False, "needs root (a user namespace maps a single uid)")
        self.note("rlimits", True, "address space, CPU, processes, file size, open files, no core dumps")
        self.note("env", True, "allow-listed environment")

    def _join_cgroup(self, is_root: bool) -> None:
        if not is_root:
            self.note("cgroup", False, "needs root")
            return
        try:
            self.cgroup = CgroupPair(f"w{os.getpid()}")
            self.note("cgroup", True, f"memory+pids cgroup {self.cgroup.name}")
        except OSError as exc:
            self.note("cgroup", False, f"cgroup v1 memory/pids controllers not usable here ({exc})")

    def _enter_namespaces(self, is_root: bool) -> int:
        """Unshare the network, mount, IPC and UTS namespaces (when not root, inside a new user
        namespace, which allows them); returns the CLONE_ flags that took effect."""
        flags = linux.CLONE_NEWIPC | linux.CLONE_NEWUTS
        flags |= linux.CLONE_NEWNET if self.config.network else 0
        flags |= linux.CLONE_NEWNS if self.config.filesystem or self.config.pid else 0
        if not is_root and not self._enter_user_namespace():
            flags = 0
        try:
            if flags:
                linux.unshare(flags)
        except OSError as exc:
            self.note("net", False, f"unshare failed: {exc.strerror}")
            self.note("ipc_uts", False, f"unshare failed: {exc.strerror}")
            return 0
        net = bool(flags & linux.CLONE_NEWNET)
        self.note("net", net, "empty network namespace" if net else "disabled")
        self.note("ipc_uts", bool(flags), "private IPC and hostname" if flags else "unavailable")
        if flags & linux.CLONE_NEWUTS:
            with contextlib.suppress(OSError):
                socket.sethostname("sandbox")
        return flags

    def _enter_user_namespace(self) -> bool:
        try:
            uid, gid = os.getuid(), os.getgid()
            linux.unshare(linux.CLONE_NEWUSER)
            write("/proc/self/setgroups", "deny")
            write("/proc/self/uid_map", f"0 {uid} 1")
            write("/proc/self/gid_map", f"0 {gid} 1")
        except OSError as exc:
            self.note("user_ns", False, f"unprivileged user namespaces unavailable ({exc.strerror})")
            return False
        self.note("user_ns", True, f"unprivileged user namespace (host uid {uid})")
        return True

    def _probe_pid_namespace(self, flags: int) -> None:
        """Keep a handle on this process's PID namespace if a new one can be made per call; else
        become the subreaper of the calls' orphans."""
        if self.config.pid and flags & linux.CLONE_NEWNS:
            try:
                self.pid_ns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
                linux.unshare(linux.CLONE_NEWPID)  # probe, then reset to our own namespace
                linux.setns(self.pid_ns_fd, linux.CLONE_NEWPID)
                self.note("pid", True, "new PID namespace per call; all of a call's processes die with it")
            except OSError as exc:
                self.pid_ns_fd = None
                self.note(
                    "pid", False, f"PID namespaces unavailable ({exc.strerror}); process-group kill instead"
                )
        else:
            self.note("pid", False, "disabled" if not self.config.pid else "needs a mount namespace")
        if self.pid_ns_fd is None:
            # Orphans of a call (a double-forked daemon) become the worker's children, so the cgroup
            # sweep after the call can reap them instead of leaving zombies to the host's init.
            with contextlib.suppress(OSError):
                linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)

    def _build_private_root(self, flags: int) -> None:
        if not (self.config.filesystem and flags & linux.CLONE_NEWNS):
            self.note("fs", False, "disabled" if not self.config.filesystem else "no mount namespace")
            return
        try:
            import tempfile

            self.root_dir = tempfile.mkdtemp(prefix="rstar2-root-")
            _build_root(self.root_dir)
            self.fs_ready = True
            self.note("fs", True, "read-only minimal root, private tmpfs /tmp and /proc per call")
        except OSError as exc:
            self.note("fs", False, f"could not build the private root ({exc}); host filesystem visible")

    # ---------------------------------------------------------------- in a zygote
    def zygote_setup(self, defaults: Limits) -> None:
        """Once per zygote: what every call inherits instead of setting it itself. The limits that
        cannot hurt the zygote (file size, open files, core dumps) and the lower CPU priority that
        keeps a call's processes from starving the worker that enforces its timeout."""
        if not self.config.enabled:
            return
        os.nice(10)
        if self.seccomp_program is not None:  # calls install the filter unprivileged, which needs this
            linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
        for res, value in rlimit_values(defaults):
            if res in _ZYGOTE_RLIMITS:
                with contextlib.suppress(ValueError, OSError):
                    resource.setrlimit(res, (value, value))
                    self.in_force[res] = value

    def plan(self, limits: Limits) -> CallPlan:
        uid = self.uid if self.uid is not None else 0
        rlimits = tuple((res, v) for res, v in rlimit_values(limits) if self.in_force.get(res) != v)
        return CallPlan(rlimits, f"size={limits.tmp_mb}m,mode=0700,uid={uid},gid={uid}".encode())

    def before_fork(self) -> None:
        """Make the next forked child the init of a fresh PID namespace (`after_fork` of the previous
        call restored this process's own namespace for children, which unshare requires)."""
        if self.pid_ns_fd is not None:
            linux.unshare(linux.CLONE_NEWPID)

    def after_fork(self) -> None:
        if self.pid_ns_fd is not None:
            linux.setns(self.pid_ns_fd, linux.CLONE_NEWPID)

    def prepare_call(self, limits: Limits) -> None:
        if self.cgroup is not None:
            self.cgroup.set_limits(limits)

    # ---------------------------------------------------------------- per call, in the child
    def enter_private_fs(self, plan: CallPlan, tmp_dir: str | None = None) -> None:
        """New session, private mount namespace with a fresh /tmp and /proc (needs privileges)."""
        if self.config.enabled:
            os.setsid()
        if self.fs_ready:  # only ever with isolation enabled
            linux.unshare(linux.CLONE_NEWNS)
            linux.mount_raw(b"tmpfs", b"/tmp", b"tmpfs", linux.MS_NOSUID | linux.MS_NODEV, plan.tmp_options)
            if self.pid_ns_fd is not None:
                linux.mount_raw(
                    b"proc", b"/proc", b"proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC, None
                )
            os.chdir("/tmp")
        elif tmp_dir is not None:
            os.chdir(tmp_dir)
        if self.config.enabled:
            with contextlib.suppress(OSError):
                write("/proc/self/oom_score_adj", "1000")

    def drop_privileges(self, plan: CallPlan, tmp_dir: str | None = None) -> None:
        """Limits, unprivileged uid, seccomp: after this the code may run. The environment is already
        the safe one (`safe_environment`, once per zygote); only a per-call temp dir changes it."""
        apply_rlimits(plan.rlimits)
        if tmp_dir is not None and not self.fs_ready:
            os.environ["HOME"] = os.environ["TMPDIR"] = tmp_dir
        if self.uid is not None:
            os.setgroups([])
            os.setresgid(self.uid, self.uid, self.uid)
            os.setresuid(self.uid, self.uid, self.uid)
        # Die with the zygote, hence with the worker (set after the uid change, which clears it).
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        if self.seccomp_program is not None:  # no_new_privs is the zygote's, inherited
            self.seccomp_program.install()


def safe_environment() -> None:
    """Replace this process's environment with the allow-listed one (nothing of the service's)."""
    os.environ.clear()
    os.environ.update(SAFE_ENV)


def _seccomp_program() -> bytes:
    """Compile the deny-list in a short-lived child: libseccomp's Python binding imports ctypes.util,
    subprocess and threading, and every module a worker holds makes each of its forks dearer."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            from .seccomp import build_program

            data = b"+" + build_program()
        except BaseException as exc:  # noqa: BLE001
            data = b"-" + repr(exc).encode()
        try:
            while data:
                data = data[os.write(w, data) :]
        finally:
            os._exit(0)
    os.close(w)
    with open(r, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    if not data.startswith(b"+"):
        raise RuntimeError(data[1:].decode(errors="replace") or "the seccomp compiler died")
    return data[1:]


def rlimit_values(limits: Limits) -> list[tuple[int, int]]:
    mb = 1024 * 1024
    return [
        (resource.RLIMIT_AS, limits.memory_mb * mb),
        (resource.RLIMIT_CPU, limits.effective_cpu_s()),
        (resource.RLIMIT_FSIZE, limits.file_size_mb * mb),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, limits.max_processes),
    ]


def apply_rlimits(values: Iterable[tuple[int, int]], strict: bool = True) -> None:
    """Set each (resource, value) as soft and hard limit; the process-count limit may fail quietly
    (it is per uid, and root is exempt anyway). `strict=False` (a session cell, whose holder's limits
    may be lower) skips what cannot be raised."""
    for res, value in values:
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            if strict and res != resource.RLIMIT_NPROC:
                raise


def _python_paths() -> list[str]:
    """Directories the interpreter needs after the root is replaced (prefixes and sys.path)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    return sorted(os.path.realpath(p) for p in paths)


def _build_root(new: str) -> None:
    """Replace / with a tmpfs holding read-only binds of what Python needs; then make it read-only.
    `new` is an empty host directory the parent removes when the worker exits."""
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    linux.mount("tmpfs", new, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "size=4m,mode=0755")
    binds = ["/usr", "/etc", "/lib", "/lib64", "/lib32", "/bin", "/sbin"]
    binds += _python_paths()
    done: list[str] = []
    for src in binds:
        if not os.path.lexists(src):
            continue
        if os.path.islink(src) and os.path.dirname(src) == "/":
            os.symlink(os.readlink(src), new + src)  # merged-/usr symlinks such as /bin -> usr/bin
            continue
        real = os.path.realpath(src)
        if any(real == d or real.startswith(d + "/") for d in done):
            continue
        target = new + real
        os.makedirs(target, exist_ok=True)
        linux.mount(real, target, None, linux.MS_BIND | linux.MS_REC)
        done.append(real)
    for d in ("tmp", "proc", "dev", "old"):
        os.makedirs(os.path.join(new, d), exist_ok=True)
    os.symlink("/tmp", os.path.join(new, "dev/shm"))  # POSIX shared memory lands in the call's /tmp
    for dev in ("null", "zero", "random", "urandom"):
        target = os.path.join(new, "dev", dev)
        open(target, "w").close()
        linux.mount("/dev/" + dev, target, None, linux.MS_BIND)
    os.symlink("/proc/self/fd", os.path.join(new, "dev/fd"))
    linux.pivot_root(new, new + "/old")
    os.chdir("/")
    linux.umount2("/old", linux.MNT_DETACH)
    os.rmdir("/old")
    try:
        linux.make_tree_readonly("/")
    except OSError:
        linux.mount(None, "/", None, linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY)
