"""The local runtime's sandbox: each command of a workspace user runs inside bubblewrap (``bwrap``).

What the sandbox gives a run, and what each part stops:

* **A PID namespace** with its own ``/proc``: the run sees only its own processes (not other tenants' command
  lines, not the worker, not its workspace's spawner, so it can neither ``ptrace`` nor signal them), and when
  its command ends the namespace's init ends and the kernel kills everything left in it, whatever it did to
  detach (``setsid``, ``nohup``, a double fork).
* **A mount namespace** whose root is built from nothing: the system folders read-only (``/usr`` and its
  links, ``/etc``: the host's, or a root filesystem's with a skill's Debian packages and its ``/var``), a fresh
  ``/dev``, private size-capped ``/tmp`` and ``/dev/shm`` (tmpfs, gone with the run),
  the run's own workspace read-write (for a run of the worker's own user, which file modes cannot keep from the
  workspace's metadata and folders, read-only but for ``work/``, ``out/``, the run folder and the staged skill)
  and the folder its skill is staged from read-only, each at its own path.
  No other workspace, no store of the platform (artifacts, libraries, run data) and no home folder is there;
  the root and ``/dev`` themselves are read-only.
* **A seccomp filter** (``worker.sandbox.seccomp``): no further user namespace can be made, so the kernel's
  user-namespace attack surface stays out of reach, nor the other kernel interfaces container engines keep from
  containers; IPC, UTS and cgroup namespaces of its own; no capabilities and no-new-privileges (bwrap sets both).

bwrap runs as the workspace user (as root) or as the worker's own user (any other account), in unprivileged user
namespaces either way, and gives every sandbox a network namespace of its own, its loopback up (a server a run
starts is reached from the same run; nothing outside is). A run without network has nothing else there; a run with
network is connected to the outside through user-mode networking
(``worker.sandbox.user_network``), never the host's. bwrap starts
blocked (``--block-fd``) and reports its init's pid and namespaces (``--json-status-fd``), so the caller can move
the sandbox into the run's control group, and connect its network, before anything of the run executes
(``release``); a served sandbox (``SandboxSpec.served``) gets a network namespace of its own with nothing but
loopback, which the caller's server serves there instead (``served_by``: a build step's sandbox gets a listening
socket of the worker's on its loopback, its only way out, to the package index: ``worker.egress.proxy``).
On the same pipe bwrap later says how the command ended (``SandboxStart.exit_code``), as soon as its init has
reaped it: the caller need not wait for bwrap's own processes to end and the namespaces to be torn down.

bwrap's monitor exits as soon as it has said so, often before its init has ended, and the init is then an orphan,
adopted and reaped by the process that starts sandboxes (``worker.sandbox.orphans``): no zombie is left on the host, and
none holds a place of its run group's ``pids.max``.

That is a sandbox of the run's own: a workspace's first run, a run with network, a run while another of its
workspace is going on. A warm run without network goes into its workspace's held sandbox instead, the same spec
made once for the workspace with the workspace's spawner as its pid 1 (``held_argv``, ``worker.sandbox.held``):
there the PID namespace's end cannot end the run's processes, its control group does, and ``/tmp``, ``/dev/shm``
and the IPC namespace are emptied between runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from worker import defaults
from worker.sandbox.cgroups.groups import RunCgroup
from worker.errors import RuntimeUnavailableError, SandboxError
from worker.sandbox.fdwait import wait_readable
from worker.sandbox.seccomp import sandbox_filter
from worker.sandbox.user_network import RESOLV_CONF, UserNetwork, find_slirp4netns, resolv_conf_target

INFO_TIMEOUT_SECONDS = 5.0
VISIBLE_PROC = "/run/skillrun/proc"
SANDBOX_HOSTNAME = "skillrun"
INIT_PID = re.compile(rb'"child-pid"\s*:\s*(\d+)\s*[,}]')
NET_NAMESPACE = re.compile(rb'"net-namespace"\s*:\s*(\d+)\s*[,}]')
"""bwrap's report (``--json-status-fd``), its first line written whole as soon as its init exists: the init's pid
first, then the namespaces it made (a network namespace only where it was asked for one)."""
EXIT_CODE = re.compile(rb'"exit-code"\s*:\s*(\d+)\s*}')
"""The report's last line: the command's exit code, or 128 + the signal that ended it (as bwrap exits with)."""
SYSTEM_LINKS = (("usr/bin", "/bin"), ("usr/sbin", "/sbin"), ("usr/lib", "/lib"), ("usr/lib64", "/lib64"),
                ("usr/libx32", "/libx32"), ("usr/lib32", "/lib32"))
"""Merged-/usr systems (Debian 12, Ubuntu): the top-level folders are links into /usr."""

NetworkServer = Callable[[int, int], Awaitable[None]]
"""Serves a served sandbox's network namespace, given its init's pid and the namespace's inode while it is still
blocked."""
_SERVER: ContextVar[NetworkServer | None] = ContextVar("skillrun_sandbox_network_server", default=None)


@contextlib.contextmanager
def served_by(server: NetworkServer) -> Iterator[None]:
    """Have ``server`` serve the network namespace of each sandbox this task starts meanwhile, before anything of
    it runs (``SandboxStart.release``), instead of user-mode networking. The server rides in the task's context
    because ``process.run_process`` takes a spec and starts the sandbox itself; a served spec is refused outside
    such a context (``SandboxSpec.argv``), so it never falls back to user-mode networking."""
    token = _SERVER.set(server)
    try:
        yield
    finally:
        _SERVER.reset(token)


@dataclass(frozen=True)
class SandboxSpec:
    """What one sandbox holds: the workspace (read-write, at its own path and at ``SANDBOX_WORKSPACE_ALIAS``),
    folders shown read-only, the size of its tmpfs.

    bwrap makes every sandbox a network namespace of its own with its loopback up: without ``network`` that is
    all there is. With it, ``release`` connects it through user-mode networking, and the sandbox gets its own
    ``resolv.conf`` (slirp's DNS forwarder).
    Such a spec is made only where that can be had (``find_slirp4netns``, checked once: the first call blocks,
    so callers on an event loop make it in a thread first); elsewhere ``RuntimeUnavailableError`` says what to
    install, before anything is started. ``served`` instead: a network namespace of its own too (bwrap brings its
    loopback up), with nothing else in it but what the starting task's server places there (``served_by``).
    ``identity``: a folder whose ``passwd`` and ``group`` the sandbox sees as ``/etc``'s
    (``worker.sandbox.identity``). ``system``: a root filesystem (``worker.environments.systems``) whose ``/usr``,
    ``/etc`` and ``/var`` the sandbox shows instead of the host's ``/usr`` and ``/etc``. ``writable``: when given,
    the workspace is shown read-only but for these folders of it (each its own mount, which the run can neither
    rename nor replace): for a run of the worker's own user, whom file modes do not keep from the workspace's
    metadata, its ``skills`` and ``runs`` folders and the links in them."""

    workspace: str
    read_only: tuple[str, ...] = ()
    tmpfs_bytes: int = defaults.SANDBOX_TMPFS_BYTES
    network: bool = False
    served: bool = False
    identity: str | None = None
    system: str | None = None
    writable: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.network and self.served:
            raise ValueError("a sandbox is connected through user-mode networking or served, not both")
        if any(not folder.startswith(self.workspace.rstrip("/") + "/") for folder in self.writable):
            raise ValueError("a sandbox's writable folders are folders of its workspace")
        if self.network:
            find_slirp4netns()

    def argv(
        self, bwrap: str, *, fds: tuple[int, int, int], cwd: str, env: dict[str, str] | None = None
    ) -> list[str]:
        """The ``bwrap`` command line up to ``--``, starting in ``cwd``; ``fds`` are the numbers the sandbox's ends
        of a ``SandboxStart`` have in the bwrap process: it reports on the first, is blocked on the second and reads
        its seccomp filter from the third. With ``env``, the command's environment is that alone, whatever bwrap's
        is (``worker.sandbox.launcher``). A served spec only in a task that serves it (``served_by``)."""
        if self.served and _SERVER.get() is None:
            raise SandboxError("a served sandbox is started only where its network is served (served_by)")
        info_fd, block_fd, seccomp_fd = fds
        environment = [] if env is None else ["--clearenv", *(a for k, v in env.items() for a in ("--setenv", k, v))]
        return [*self._layout(bwrap), *environment, "--chdir", cwd, "--json-status-fd", str(info_fd), "--block-fd", str(block_fd),
                "--seccomp", str(seccomp_fd), "--"]

    def held_argv(self, bwrap: str, *, info_fd: int, seccomp_fd: int) -> list[str]:
        """The ``bwrap`` command line up to ``--`` of a workspace's held sandbox (``worker.sandbox.held``): the same
        layout, its command the namespace's pid 1 (``--as-pid-1``: no init of bwrap's), started in ``/``, reporting
        its pid on ``info_fd`` and reading its seccomp filter from ``seccomp_fd``. Without network only."""
        if self.network or self.served:
            raise SandboxError("a held sandbox has no network of its own")
        return [*self._layout(bwrap), "--as-pid-1", "--chdir", "/", "--json-status-fd", str(info_fd),
                "--seccomp", str(seccomp_fd), "--"]

    def _workspace_args(self) -> list[str]:
        """The workspace at its own path and at ``SANDBOX_WORKSPACE_ALIAS``: read-write, or read-only with its
        ``writable`` folders read-write on top."""
        alias = defaults.SANDBOX_WORKSPACE_ALIAS
        if not self.writable:
            return ["--bind", self.workspace, self.workspace, "--bind", self.workspace, alias]
        args = ["--ro-bind", self.workspace, self.workspace, "--ro-bind", self.workspace, alias]
        for folder in self.writable:
            inside = alias + folder[len(self.workspace):]
            args += ["--bind", folder, folder, "--bind", folder, inside]
        return args

    def _layout(self, bwrap: str) -> list[str]:
        """The namespaces and mounts: everything of the command line but how the sandbox starts."""
        args = [bwrap, *_NAMESPACES, *_system_args(self.system or "/")]
        if self.identity is not None:
            args += ["--ro-bind", f"{self.identity}/passwd", "/etc/passwd", "--ro-bind", f"{self.identity}/group",
                     "/etc/group"]
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--size", str(self.tmpfs_bytes), "--perms", "1777", "--tmpfs", "/tmp",
                 "--size", str(self.tmpfs_bytes), "--perms", "1777", "--tmpfs", "/dev/shm",
                 *self._workspace_args()]
        for folder in self.read_only:
            args += ["--ro-bind", folder, folder]
        args += ["--unshare-net"]  # loopback up, nothing else: what served and connected sandboxes add to
        if self.network:  # over the file the system's /etc/resolv.conf is (a root filesystem's is one)
            args += ["--ro-bind", RESOLV_CONF, "/etc/resolv.conf" if self.system else resolv_conf_target()]
        # The sandbox's own root and /dev are tmpfs with no size of their own: read-only once laid out, so a run
        # writes nowhere but its workspace, /tmp and /dev/shm.
        return args + ["--remount-ro", "/dev", "--remount-ro", "/"]


_NAMESPACES = ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
               "--die-with-parent", "--hostname", SANDBOX_HOSTNAME)
SYSTEM_FOLDERS = ("usr", "etc")
ROOT_ONLY_FOLDERS = ("var",)
"""What a root filesystem shows besides the host's own system folders: its packages' state and data (Debian's
packages install nothing in ``/opt``, where the sandbox's own tools go)."""


@functools.lru_cache(maxsize=64)
def _system_args(root: str) -> tuple[str, ...]:
    """The read-only system folders a sandbox gets from ``root`` (``/``: the host's; else a root filesystem's, with
    its ``/var`` and ``/opt``), looked at once per root."""
    args: list[str] = []
    for name in SYSTEM_FOLDERS + (ROOT_ONLY_FOLDERS if root != "/" else ()):
        if os.path.isdir(os.path.join(root, name)) and not os.path.islink(os.path.join(root, name)):
            args += ["--ro-bind", os.path.join(root, name), f"/{name}"]
    for target, link in SYSTEM_LINKS:
        found = os.path.join(root, link[1:])
        if os.path.islink(found):
            args += ["--symlink", target, link]
        elif os.path.isdir(found):
            args += ["--ro-bind", found, link]
    if os.path.exists(os.path.join(root, "usr/bin/python3")):  # `python`, as skills' docs write it
        args += ["--dir", defaults.SANDBOX_TOOLS_DIR, "--symlink", "/usr/bin/python3",
                 f"{defaults.SANDBOX_TOOLS_DIR}/python"]
    return tuple(args)


UNSANDBOXED_HINT = ("or, to run commands without the sandbox (as this account, seeing what it sees), set "
                    "SKILLRUN_LOCAL_SANDBOX=false")


@functools.cache
def find_bwrap() -> str:
    """bubblewrap, checked once: it must be installed and able to make its namespaces as an unprivileged user (as
    root, the probe runs as ``nobody``; as any other account, as that account).

    The kernel lets a user namespace mount a ``/proc`` only where a fully visible one is mounted already; a
    container's ``/proc`` has parts masked (Docker's defaults), so a worker running as root there mounts an unmasked
    one out of the way (``VISIBLE_PROC``) first. No run sees it: a sandbox's root is built from nothing."""
    bwrap = shutil.which("bwrap", path=defaults.SANDBOX_PATH + ":/usr/sbin:/sbin")
    if bwrap is None:
        raise RuntimeUnavailableError(
            "bubblewrap is not installed; the local runtime sandboxes every command with it: install it (apt-get "
            f"install bubblewrap), {UNSANDBOXED_HINT}"
        )
    probe = _probe(bwrap)
    if probe.returncode != 0 and os.geteuid() == 0 and _proc_is_masked():
        os.makedirs(VISIBLE_PROC, mode=0o700, exist_ok=True)
        subprocess.run(["mount", "-t", "proc", "-o", "nosuid,nodev,noexec", "proc", VISIBLE_PROC],
                       capture_output=True, timeout=30)
        probe = _probe(bwrap)
    if probe.returncode != 0:
        raise RuntimeUnavailableError(
            f"bubblewrap cannot make its namespaces here ({probe.stderr.strip() or probe.returncode}): allow "
            "unprivileged user namespaces (sysctl user.max_user_namespaces > 0; on Debian's older kernels "
            "kernel.unprivileged_userns_clone=1; on Ubuntu an AppArmor profile for bwrap, or "
            "kernel.apparmor_restrict_unprivileged_userns=0); in a container, give the worker CAP_SYS_ADMIN and no "
            "AppArmor profile that forbids mounts (docker: --cap-add SYS_ADMIN --security-opt apparmor=unconfined); "
            f"{UNSANDBOXED_HINT}"
        )
    return bwrap


def _probe(bwrap: str) -> subprocess.CompletedProcess:
    """Make a sandbox's namespaces once, as an unprivileged user. ``--as-pid-1``: its command is its pid 1, which
    its monitor waits for and reaps, so the probe leaves no orphan."""
    unprivileged = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    return subprocess.run(
        [*unprivileged, bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--as-pid-1", "--ro-bind", "/",
         "/", "--proc", "/proc", "--", "/bin/true"],
        capture_output=True, text=True, timeout=30,
    )


def _proc_is_masked() -> bool:
    """Whether something is mounted over part of ``/proc`` (as container engines do)."""
    with open("/proc/self/mountinfo") as mounts:
        return any(line.split()[4].startswith("/proc/") for line in mounts)


async def _loopback_set_up(pid: int, timeout: float) -> None:
    """Wait until bwrap has given the sandbox's new network namespace its loopback address. It fails if one is there
    already, as the helper's configuration leaves it (slirp4netns brings ``lo`` up, and the kernel addresses it), so
    the helper starts only after, as does a served sandbox's server (it listens on that address); it takes bwrap a
    moment after its report, and bwrap tells nothing of it, so the namespace's routes
    (``/proc/<pid>/net/fib_trie``, readable by anyone) are looked at every millisecond."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/net/fib_trie") as routes:
                if "127.0.0.1\n" in routes.read():
                    return
        except (FileNotFoundError, ProcessLookupError):
            raise ProcessLookupError(pid) from None
        if loop.time() > deadline:
            raise SandboxError(f"the sandbox did not set up its loopback within {timeout:g} s")
        await asyncio.sleep(0.001)


class SandboxStart:
    """The host's end of a sandbox being started: the pipe it reports its init's pid (and later its command's end)
    on, the one that holds it until the caller has placed it in its control group (and connected its network), and
    the one it reads its seccomp filter from; then the sandbox's user-mode networking, if it has a network namespace
    of its own."""

    def __init__(self) -> None:
        self.info_r, self.info_w = os.pipe()
        self.block_r, self.block_w = os.pipe()
        self.seccomp_r, seccomp_w = os.pipe()
        try:
            os.write(seccomp_w, sandbox_filter())  # a few hundred bytes: the pipe takes them at once
        finally:
            os.close(seccomp_w)
        self.init_pid = 0
        self.init_pidfd = -1
        self.network: UserNetwork | None = None
        self._rest = b""
        self.report_closed = False

    def child_fds(self) -> tuple[int, int, int]:
        """The ends the sandbox gets, in ``SandboxSpec.argv``'s order (close them here once it has them: ``sent``)."""
        return self.info_w, self.block_r, self.seccomp_r

    def sent(self) -> None:
        """The sandbox (or the spawner starting it) holds its ends now."""
        for fd in self.child_fds():
            os.close(fd)
        self.info_w = self.block_r = self.seccomp_r = -1

    async def release(
        self, cgroup: RunCgroup | None, *, connect: bool, timeout: float = INFO_TIMEOUT_SECONDS
    ) -> None:
        """Wait (on the loop) for the sandbox's init, put it in ``cgroup``, with ``connect`` (``SandboxSpec.network``
        or ``served``) connect its network namespace or have the task's server serve it (``served_by``), and let it
        run. Without, its namespace keeps its loopback alone.

        A bwrap that failed before making its sandbox reports nothing and exits with its message on stderr, which
        becomes the run's. ``SandboxError`` if it neither reported nor ended in time or its network could not be
        connected, ``CgroupError`` if it could not be placed: then the caller kills it (it is still blocked) before
        ``close``."""
        report = await self._report(timeout)
        match = INIT_PID.search(report)
        if match is None:
            return  # bwrap failed: nothing to place, and its message is on stderr
        self.init_pid = int(match.group(1))
        network = NET_NAMESPACE.search(report)
        try:
            self.init_pidfd = os.pidfd_open(self.init_pid)  # while it is blocked: its pid cannot have been reused
            if cgroup is not None:
                cgroup.add(self.init_pid)
            if network is not None and connect:
                await _loopback_set_up(self.init_pid, timeout)
                if (server := _SERVER.get()) is not None:
                    await server(self.init_pid, int(network.group(1)))
                else:
                    self.network = UserNetwork(self.init_pid, int(network.group(1)), cgroup)
                    await self.network.ready()
            os.write(self.block_w, b"1")
        except (ProcessLookupError, BrokenPipeError):
            return  # killed already (a cancel or the deadline came first): nothing is left to let go

    async def _report(self, timeout: float) -> bytes:
        """bwrap's report, whole (up to its closing brace), or what it wrote before it ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        os.set_blocking(self.info_r, False)
        report = b""
        while not report.rstrip().endswith(b"}"):
            try:
                chunk = os.read(self.info_r, 4096)
            except BlockingIOError:
                if not await wait_readable(self.info_r, deadline - loop.time()):
                    raise SandboxError(f"the sandbox did not start within {timeout:g} s") from None
                continue
            if not chunk:
                break
            report += chunk
        return report

    def exit_code(self) -> int | None:
        """How the sandbox's command ended, once bwrap has said so on the report pipe (its init has reaped the
        command; bwrap's own processes may still be ending): the command's exit code, or 128 + the signal that ended
        it. ``None`` until then, and for good once bwrap closed the pipe without saying (``report_closed``: it was
        killed, or the command could not be started). Reads what the pipe holds, without blocking."""
        while not self.report_closed:
            try:
                chunk = os.read(self.info_r, 4096)
            except BlockingIOError:
                break
            self._rest += chunk
            self.report_closed = not chunk
        match = EXIT_CODE.search(self._rest)
        return int(match.group(1)) if match else None

    def close(self) -> None:
        """Close what the host still holds. A sandbox never released reads the end of its block pipe and goes on,
        so callers kill one they did not release first. Its user-mode networking, if any, ends here."""
        if self.network is not None:
            self.network.close()
            self.network = None
        for name in ("info_r", "info_w", "block_r", "block_w", "seccomp_r", "init_pidfd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)
