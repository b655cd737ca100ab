"""The seccomp deny-list: system calls model-written math code never needs. It is compiled once per
worker with libseccomp (through pyseccomp) and exported as raw BPF; each call then installs those
bytes with one prctl, which costs microseconds."""

from __future__ import annotations

import errno
import tempfile

# Denied with EPERM, by what they would let the code do:
DENIED = tuple(
    (
        # escape the sandbox's view: mounts and namespaces
        "mount umount2 pivot_root chroot unshare setns mount_setattr move_mount open_tree fsopen fsconfig "
        "fsmount fspick "
        # reach into other processes
        "ptrace process_vm_readv process_vm_writev kcmp pidfd_getfd "
        # the kernel's large attack surfaces (io_uring also bypasses per-syscall filtering)
        "bpf perf_event_open userfaultfd io_uring_setup io_uring_enter io_uring_register "
        # change the machine: kernels, modules, reboot, swap, accounting, logs, clocks, names, keyrings
        "kexec_load kexec_file_load reboot init_module finit_module delete_module swapon swapoff acct "
        "quotactl syslog vhangup settimeofday clock_settime clock_adjtime adjtimex sethostname "
        "setdomainname keyctl add_key request_key "
        # other files by handle, other processes' file events, hardware ports, execution domains
        "open_by_handle_at name_to_handle_at fanotify_init lookup_dcookie iopl ioperm personality"
    ).split()
)

_AF_NETLINK, _AF_PACKET, _SOCK_RAW = 16, 17, 3


def build_program() -> bytes:
    """Compile the deny-list into BPF bytes for this machine's architecture."""
    import pyseccomp as sc

    flt = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            flt.add_rule(deny, name)
        except Exception:  # a call this architecture does not have
            continue
    # clone() asking for a new namespace (each CLONE_NEW* flag); clone3 passes flags in memory, so
    # make glibc fall back to clone.
    for bit in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    # raw and packet sockets, netlink (routing/firewall configuration)
    flt.add_rule(deny, "socket", sc.Arg(0, sc.EQ, _AF_PACKET))
    flt.add_rule(deny, "socket", sc.Arg(0, sc.EQ, _AF_NETLINK))
    flt.add_rule(deny, "socket", sc.Arg(1, sc.MASKED_EQ, 0xF, _SOCK_RAW))
    with tempfile.TemporaryFile() as fh:
        flt.export_bpf(fh)  # libseccomp writes to the descriptor, past the file object's buffer
        fh.seek(0)
        program = fh.read()
    if not program or len(program) % 8:
        raise RuntimeError("libseccomp exported an empty or malformed BPF program")
    return program
