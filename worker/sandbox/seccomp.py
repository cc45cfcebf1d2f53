"""The system calls a sandboxed local run may not make: a seccomp filter, built once with libseccomp.

bubblewrap loads it (``--seccomp FD``) into the run's sandbox just before the command starts. It refuses:

* **new user namespaces** (``unshare`` or ``clone`` with ``CLONE_NEWUSER``; ``clone3``, whose flags a filter
  cannot read, answers "not implemented" so the C library falls back to ``clone``): inside one a process holds
  every capability over its own namespaces, the kernel's largest attack surface for an unprivileged user;
* the kernel interfaces container engines keep from containers by default and that an unprivileged process may
  otherwise reach: the kernel keyring, BPF programs, performance events, ``userfaultfd``, ``io_uring``, file
  handles, and mounting, module, swap, reboot and accounting calls (refused already without capabilities; here
  they are refused before the kernel looks at them);
* POSIX message queues (``mq_open``): they live in the IPC namespace, which a workspace's held sandbox keeps from
  one run to the next (``worker.sandbox.held``), and cannot be listed there to be removed between runs.

Refused calls fail with ``EPERM`` (``clone3`` with ``ENOSYS``); everything else is allowed.
"""

from __future__ import annotations

import errno
import functools
import os

import pyseccomp

from worker.errors import RuntimeUnavailableError

CLONE_NEWUSER = 0x10000000
REFUSED = (
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at", "name_to_handle_at",
    "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "setns", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "swapon", "swapoff", "reboot", "acct", "quotactl", "lookup_dcookie", "vm86", "vm86old", "mq_open",
)


@functools.cache
def sandbox_filter() -> bytes:
    """The filter as a BPF program in this machine's format (what ``bwrap --seccomp`` reads)."""
    refuse = pyseccomp.ERRNO(errno.EPERM)
    rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    try:
        for call in ("unshare", "clone"):  # the flags are the first argument of both (on every architecture here)
            rules.add_rule(refuse, call, pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
        rules.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
        for call in REFUSED:
            try:
                rules.add_rule(refuse, call)
            except (ValueError, RuntimeError):  # a call this architecture does not have (vm86 beyond i386)
                continue
        read, write = os.pipe()
        try:
            with os.fdopen(write, "wb") as out:
                rules.export_bpf(out)
            return _read_all(read)
        finally:
            os.close(read)
    except (OSError, RuntimeError, ValueError) as exc:
        raise RuntimeUnavailableError(f"cannot build the sandbox's seccomp filter with libseccomp: {exc}") from exc


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    return data
