"""User-mode networking for sandboxes that may reach the network: ``slirp4netns`` serving one run's namespace.

A run that asks for network (and a runtime that allows it) must not share the host's network namespace: there it
would reach every service on the host's loopback (Redis, the API: other tenants' data) and the host's abstract
unix sockets. Instead bubblewrap gives the sandbox a network namespace of its own (``SandboxSpec.network``), and
before anything of the run executes (``SandboxStart.release``) a ``UserNetwork`` connects that namespace to the
outside: slirp4netns opens a tap device inside it and carries its traffic through ordinary sockets of the host.

What the run sees: ``lo`` and ``tap0`` (10.0.2.100/24, gateway 10.0.2.2), DNS through slirp's forwarder at
10.0.2.3 (its own ``resolv.conf``, laid over the host's inside the sandbox). What it does not: the host's
interfaces, addresses and sockets, and the host's loopback (``--disable-host-loopback``: the gateway does not lead
to 127.0.0.1). Addresses of the host other than loopback are reached as from any other machine of that network.

slirp4netns (1.2.0 on Debian 12) rather than pasta: it reports readiness and ends with a descriptor the worker
holds (``--ready-fd``, ``--exit-fd``), uses fixed private addresses that say nothing of the host's, and forwards no
port unless asked; Debian 12's pasta (a 2023 snapshot) has no such descriptors, daemonizes by default, copies the
host's addresses and routes into the namespace and forwards ports both ways unless each direction is turned off.

The helper runs as the sandbox's own user, the owner of its namespaces (the least that may join them), with no
capabilities, no supplementary groups, no-new-privileges and slirp's own seccomp filter, in the run's control
group (what the run makes it do counts against the run's limits), outside the run's PID namespace (the run can
neither see, signal nor trace it), holding no descriptor of the run's. It ends when the run ends (``close``), and
with the worker: its exit descriptor is held by the worker alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import functools
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator

import pyseccomp

from worker import defaults
from worker.sandbox.cgroups.groups import RunCgroup
from worker.errors import RuntimeUnavailableError, SandboxError
from worker.sandbox.fdwait import wait_readable
from worker.workspaces.user_ids import SETPRIV_HARDENING, find_setpriv

READY_TIMEOUT_SECONDS = 5.0
TAP_NAME = "tap0"
MTU = 65520
"""Near the largest slirp4netns takes (65521), as rootless Podman sets it: fewer, larger packets through the helper."""
DNS_FORWARDER = "10.0.2.3"
RESOLV_CONF = "/run/skillrun/net/resolv.conf"
"""The sandbox's ``resolv.conf`` (root's, read-only to everyone else), laid over the host's inside the sandbox."""
TUN_DEVICE = "/dev/net/tun"
TUN_NUMBERS = (10, 200)
NS_GET_USERNS = 0xB701
"""ioctl on a namespace: the user namespace that owns it (``linux/nsfs.h``)."""


@functools.cache
def find_slirp4netns() -> str:
    """slirp4netns, checked once, with what it needs: a tap device its unprivileged user may open, and the
    sandbox's ``resolv.conf``. A network run on a sandboxed runtime fails with this error rather than fall back to
    the host's network namespace."""
    slirp = shutil.which("slirp4netns", path=defaults.SANDBOX_PATH + ":/usr/sbin:/sbin")
    if slirp is None:
        raise RuntimeUnavailableError(
            "slirp4netns is not installed; a sandboxed run with network gets a network namespace of its own, "
            "connected through it (apt-get install slirp4netns)"
        )
    _share_tun_device()
    _write_resolv_conf()
    resolv_conf_target()
    return slirp


def _share_tun_device() -> None:
    """Let unprivileged users open ``/dev/net/tun``, as udev does on most distributions (mode 0666: opening it
    gives nothing; making or joining a tap device needs CAP_NET_ADMIN over the namespace it is in). Without udev
    (containers, small virtual machines) the kernel makes it root's alone, or not at all: a root worker makes it
    so here."""
    try:
        try:
            mode = os.stat(TUN_DEVICE).st_mode
        except FileNotFoundError:
            os.makedirs(os.path.dirname(TUN_DEVICE), mode=0o755, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # made meanwhile (another run, another worker)
                os.mknod(TUN_DEVICE, stat.S_IFCHR | 0o666, os.makedev(*TUN_NUMBERS))
            mode = os.stat(TUN_DEVICE).st_mode
        if stat.S_IMODE(mode) & 0o666 != 0o666:
            os.chmod(TUN_DEVICE, 0o666)
    except OSError as exc:
        raise RuntimeUnavailableError(
            f"{TUN_DEVICE} cannot be made usable for sandbox users ({exc.strerror}): run the worker as root, and in a "
            f"container give it the device (docker: --device {TUN_DEVICE})"
        ) from exc


def _write_resolv_conf() -> None:
    """The sandbox's ``resolv.conf``: slirp's DNS forwarder, which asks the host's resolver. Written once, whole
    (a rename), readable by every sandbox user; the host's own is not touched."""
    folder = os.path.dirname(RESOLV_CONF)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=folder, prefix=".resolv.conf.")
    with os.fdopen(fd, "w") as out:
        out.write(f"nameserver {DNS_FORWARDER}\n")
        os.fchmod(fd, 0o644)
    os.replace(partial, RESOLV_CONF)


@functools.cache
def resolv_conf_target() -> str:
    """Where the sandbox's ``resolv.conf`` goes: over the file the host's ``/etc/resolv.conf`` leads to (a link into
    ``/run``, as systemd-resolved makes it, is followed: that path is made in the sandbox's own root)."""
    target = os.path.realpath("/etc/resolv.conf")
    if not os.path.exists(target) and target.startswith(("/etc/", "/usr/")):
        raise RuntimeUnavailableError(
            f"{target} does not exist: a network run's sandbox cannot be given its own DNS settings there "
            "(the sandbox shows /etc read-only); create it, for example with the host's nameserver"
        )
    return target


class UserNetwork:
    """slirp4netns serving the network namespace of one sandbox, from its start (``__init__``; ``ready`` says when
    the namespace is configured) to ``close``."""

    def __init__(self, pid: int, namespace: int, cgroup: RunCgroup | None) -> None:
        """Start slirp4netns for the network namespace ``namespace`` (its inode, as bwrap reported it) of the
        sandbox whose init is ``pid``, in ``cgroup``. ``ProcessLookupError`` if that sandbox is gone."""
        setpriv = find_setpriv()
        if setpriv is None:
            raise RuntimeUnavailableError("util-linux setpriv is needed to run slirp4netns as the sandbox's user")
        uid, gid = _owner(pid)
        netns, userns = _namespaces(pid, namespace, uid)
        fds = [netns, userns]
        self._ready = self._exit = self._errors = -1
        self._proc: subprocess.Popen | None = None
        try:
            self._ready, ready_w = os.pipe()
            fds.append(ready_w)
            exit_r, self._exit = os.pipe()
            fds.append(exit_r)
            self._errors = os.memfd_create("slirp4netns-errors")
            self._proc = subprocess.Popen(
                [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                 *SETPRIV_HARDENING, find_slirp4netns(), "--configure", f"--mtu={MTU}", "--disable-host-loopback",
                 "--enable-seccomp", f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", "--netns-type=path",
                 f"--userns-path=/proc/self/fd/{userns}", f"/proc/self/fd/{netns}", TAP_NAME],
                pass_fds=(ready_w, exit_r, netns, userns), env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._errors, process_group=0,
            )
        except BaseException:
            self.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        try:
            if cgroup is not None:
                cgroup.add(self._proc.pid)
        except ProcessLookupError:
            pass  # it ended at once: ``ready`` says why
        except BaseException:
            self.close()
            raise

    async def ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        """Wait (on the loop) until the namespace is configured; ``SandboxError`` with slirp4netns's own message if
        it ended first, or after ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        os.set_blocking(self._ready, False)
        while True:
            try:
                said = os.read(self._ready, 1)
                break
            except BlockingIOError:
                if not await wait_readable(self._ready, deadline - loop.time()):
                    raise SandboxError(f"user-mode networking (slirp4netns) did not start within {timeout:g} s") from None
        os.close(self._ready)
        self._ready = -1
        if not said:
            raise SandboxError(f"user-mode networking (slirp4netns) did not start: {self._failure()}")

    def _failure(self) -> str:
        """What slirp4netns said before it ended (the end of it), and how it ended."""
        try:
            status = self._proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            status = None
        said = os.pread(self._errors, 4096, max(os.fstat(self._errors).st_size - 4096, 0)).decode(errors="replace")
        lines = " / ".join(line for line in said.splitlines() if line.strip())
        return f"{lines or 'no message'} (exit status {status})"

    def close(self) -> None:
        """End the helper (SIGKILL: the run it served is over, or never started) and have it reaped."""
        if self._proc is not None:
            self._proc.kill()
            _reap(self._proc)
            self._proc = None
        for name in ("_ready", "_exit", "_errors"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)


def _reap(proc: subprocess.Popen) -> None:
    """Reap ``proc`` once it has ended, in the running loop's executor where there is one: a helper's exit removes
    its tap device, which takes the kernel some 20 ms (network-wide synchronisation) that a run's caller need not
    wait for; ``asyncio.run`` waits for the executor before it returns, so nothing is left unreaped. The run's
    control group waits for it to be empty before it is used again."""
    try:
        asyncio.get_running_loop().run_in_executor(None, proc.wait)
    except RuntimeError:
        proc.wait()


def _namespaces(pid: int, namespace: int, uid: int) -> tuple[int, int]:
    """The network namespace of process ``pid``, if it still is ``namespace`` (``open_network_namespace``), and the
    user namespace that owns it: bwrap's first one, not the one its processes are in (bwrap nests a second inside,
    where ``/dev/pts`` is mounted), which has no say over the network namespace."""
    netns = open_network_namespace(pid, uid, namespace)
    try:
        return netns, fcntl.ioctl(netns, NS_GET_USERNS)
    except BaseException:
        os.close(netns)
        raise


def open_network_namespace(pid: int, uid: int, namespace: int) -> int:
    """The network namespace of process ``pid`` of the sandbox user ``uid`` (a close-on-exec descriptor), if it still
    is ``namespace`` (its inode, as bwrap reported it); ``ProcessLookupError`` otherwise: the sandbox was killed, its
    pid may even be another's.

    Opened as the sandbox's user ``uid``: a sandbox's namespaces are open to their owner, and to root only with
    CAP_SYS_PTRACE, which a worker in a container does not have. This thread alone acts as that user meanwhile
    (credentials are per thread to the kernel; the C library's ``seteuid`` would change every thread's)."""
    with _acting_as(uid):
        try:
            netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, ProcessLookupError):
            raise ProcessLookupError(pid) from None
    if os.fstat(netns).st_ino != namespace:
        os.close(netns)
        raise ProcessLookupError(pid)
    return netns


@contextlib.contextmanager
def _acting_as(uid: int) -> Iterator[None]:
    """Make the calling thread's effective user id ``uid`` for a moment, then root's again (its saved one)."""
    setresuid = _setresuid()
    if setresuid(-1, uid, -1) != 0:
        raise OSError(ctypes.get_errno(), f"cannot act as user {uid}: {os.strerror(ctypes.get_errno())}")
    try:
        yield
    finally:
        if setresuid(-1, 0, -1) != 0:
            raise OSError(ctypes.get_errno(), f"cannot act as root again: {os.strerror(ctypes.get_errno())}")


@functools.cache
def _setresuid() -> Callable[[int, int, int], int]:
    """The raw ``setresuid`` system call (this thread's credentials only), with uid_t arguments (-1: unchanged)."""
    libc = ctypes.CDLL(None, use_errno=True)
    number = pyseccomp.resolve_syscall(pyseccomp.system_arch(), "setresuid")
    return lambda real, effective, saved: libc.syscall(
        ctypes.c_long(number), ctypes.c_long(real), ctypes.c_long(effective), ctypes.c_long(saved))


def _owner(pid: int) -> tuple[int, int]:
    """The real user and group of the sandbox's init (the workspace user, who made its namespaces); never root."""
    ids = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("Uid", "Gid"):
                    ids[key] = int(value.split()[0])
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessLookupError(pid) from None
    if not ids.get("Uid") or not ids.get("Gid"):
        raise SandboxError("user-mode networking runs only for a sandbox of an unprivileged user, not root's")
    return ids["Uid"], ids["Gid"]
