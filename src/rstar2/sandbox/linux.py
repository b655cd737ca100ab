"""Thin ctypes wrappers over the Linux calls the sandbox needs (namespaces, mounts, seccomp): Python
3.10/3.11 expose none of these in `os`; each wrapper raises OSError with errno like `os` does."""

from __future__ import annotations

import ctypes
import errno
import os
import platform

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

_SYS_MOUNT_SETATTR = 442  # same number on x86_64 and aarch64
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(platform.machine())
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2


def _check(ret: int, what: str) -> None:
    if ret == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None
) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    mount_raw(enc(source), target.encode(), enc(fstype), flags, enc(data))


def mount_raw(
    source: bytes | None, target: bytes, fstype: bytes | None, flags: int, data: bytes | None
) -> None:
    """`mount` with its arguments already encoded: a call's child does as little Python as it can."""
    if _libc.mount(source, target, fstype, flags, data) == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target.decode()}: {os.strerror(err)}")


def umount2(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    if _SYS_PIVOT_ROOT is None:
        raise OSError(errno.ENOSYS, "pivot_root: unknown architecture")
    _check(_libc.syscall(_SYS_PIVOT_ROOT, new_root.encode(), put_old.encode()), "pivot_root")


class _MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]


def make_tree_readonly(path: str) -> None:
    """Read-only and nosuid for a mount and everything mounted below it (Linux >= 5.12)."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    dirfd, flags = ctypes.c_int(AT_FDCWD), ctypes.c_uint(AT_RECURSIVE)
    size = ctypes.c_size_t(ctypes.sizeof(attr))
    ret = _libc.syscall(_SYS_MOUNT_SETATTR, dirfd, path.encode(), flags, ctypes.byref(attr), size)
    _check(ret, f"mount_setattr {path}")


def prctl(option: int, arg2: int = 0) -> None:
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), 0, 0, 0), f"prctl {option}")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class SeccompProgram:
    """A raw classic-BPF seccomp program (8 bytes per instruction), laid out in C memory once so that
    each forked call installs it with a single prctl."""

    def __init__(self, program: bytes) -> None:
        self._buf = ctypes.create_string_buffer(program, len(program))
        self._prog = _SockFprog(len(program) // 8, ctypes.cast(self._buf, ctypes.c_void_p))
        self._ref = ctypes.byref(self._prog)
        self._args = (ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER))

    def install(self) -> None:
        """Apply the filter to this process and its future children. Needs no_new_privs."""
        _check(_libc.prctl(*self._args, self._ref, 0, 0), "seccomp")


MADV_COLLAPSE = 25  # Linux >= 6.1
_HUGE = 2 << 20
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def collapse_anonymous_memory(maps: str) -> int:
    """Back this process's private writable memory (`maps`: its /proc/PID/maps) with 2 MiB pages
    where the kernel allows; returns the bytes so backed (0 without MADV_COLLAPSE). Why: fork copies,
    and exit tears down, one page-table entry per 4 KiB page, and a process holding numpy and sympy
    maps thousands of them; for memory it no longer writes, huge pages make that one per 2 MiB."""
    done = 0
    for line in maps.splitlines():
        parts = line.split()
        if len(parts) < 5:
            continue
        perms, path = parts[1], parts[5] if len(parts) > 5 else ""
        if not perms.startswith("rw") or perms[3] != "p" or (path and path != "[heap]"):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        lo, hi = (start + _HUGE - 1) & ~(_HUGE - 1), end & ~(_HUGE - 1)
        if hi > lo and _libc.madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            done += hi - lo
    return done


def close_fds_except(keep: set[int]) -> None:
    """Close every descriptor from 3 up except those in `keep` (a freshly forked helper's clean-up)."""
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def memfd_with(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding `data`, positioned at its start (close-on-exec)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
