"""Running one shell command as a process group, with a deadline, resource limits and capped output.

Blocking by design: callers in async code run it through ``asyncio.to_thread``. The command runs as
``bash -c`` (not a login shell) in a new process group; resource limits are applied by ``ulimit`` in that
shell before the command, so they need no ``preexec_fn`` and cannot be raised again by an unprivileged user.
When the command ends, times out or is cancelled, its whole process group is killed, so a backgrounded child
that holds stdout open does not hold the run; when the command runs as a dedicated user, a child that left
the group (``setsid``) and still holds the pipes is found and killed by its user id.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from worker import defaults
from worker.contract import RunLimits
from worker.errors import RuntimeUnavailableError
from worker.spawner import Spawner

TIMEOUT_EXIT_CODE = 124
READ_BYTES = 64 * 1024

_ULIMIT_FLAGS = (
    # (bash flag, resource, field of RunLimits, divisor to bash's unit)
    ("-t", resource.RLIMIT_CPU, "cpu_seconds", 1),
    ("-v", resource.RLIMIT_AS, "memory_bytes", 1024),
    ("-f", resource.RLIMIT_FSIZE, "file_size_bytes", 1024),
    ("-n", resource.RLIMIT_NOFILE, "open_files", 1),
)


@dataclass
class ProcessOutcome:
    stdout: bytes
    stderr: bytes
    stdout_omitted: int
    stderr_omitted: int
    exit_code: int
    timed_out: bool
    cancelled: bool
    duration_ms: int
    notes: list[str]
    oom_killed: bool = False


SETPRIV_HARDENING = ("--no-new-privs", "--bounding-set=-all", "--inh-caps=-all")
"""Also drop every capability from the bounding set and forbid setuid binaries from raising privileges."""


@functools.cache
def find_setpriv() -> str | None:
    """util-linux's ``setpriv`` switches user in the exec'd child, so the (large) host process can spawn with
    vfork instead of fork: several milliseconds less per run than ``Popen(user=...)``."""
    return shutil.which("setpriv", path=defaults.SANDBOX_PATH + ":/usr/sbin:/sbin")


def find_bash() -> str:
    bash = shutil.which("bash", path=defaults.SANDBOX_PATH) or shutil.which("bash")
    if bash is None:
        raise RuntimeUnavailableError("bash is not installed; the local runtime runs commands with bash")
    return bash


def ulimit_prefix(limits: RunLimits, *, dedicated_user: bool) -> str:
    """A ``ulimit`` line that lowers soft and hard limits to ``limits`` (never above the current hard limit).

    The process-count limit is applied only for a dedicated user: it counts every process of the user, so on a
    developer's own account it would count their whole desktop.
    """
    parts = []
    flags = list(_ULIMIT_FLAGS)
    if dedicated_user:
        flags.append(("-u", resource.RLIMIT_NPROC, "processes", 1))
    for flag, res, field, divisor in flags:
        wanted = getattr(limits, field)
        _, hard = resource.getrlimit(res)
        if hard != resource.RLIM_INFINITY:
            wanted = min(wanted, hard)
        parts.append(f"{flag} {max(wanted // divisor, 1)}")
    return f"ulimit -S -H {' '.join(parts)} || exit 125; "


def remote_ulimit_prefix(limits: RunLimits) -> str:
    """A ``ulimit`` line for a shell on another machine, whose hard limits are not known here: each limit is
    lowered to ``limits``, or to that machine's hard limit where that is lower (the sandbox user is dedicated, so
    the process count is limited too). Builtins only: no process is started for it."""
    flags = [*_ULIMIT_FLAGS, ("-u", resource.RLIMIT_NPROC, "processes", 1)]
    return "".join(
        f"{{ ulimit -S -H {flag} {max(getattr(limits, field) // divisor, 1)} || ulimit -S {flag} hard; }} 2>/dev/null; "
        for flag, _, field, divisor in flags
    )


class _Started:
    """A started command: its pid (also its process group), the read ends of its pipes, and how to get its status."""

    def __init__(self, pid: int, out_fd: int, err_fd: int, status: Callable[[], int | None]) -> None:
        self.pid = pid
        self.out_fd = out_fd
        self.err_fd = err_fd
        self.status = status


def _start_direct(
    argv: list[str], cwd: str, env: dict[str, str], uid: int | None, gid: int | None, no_network: bool
) -> tuple[_Started, subprocess.Popen]:
    user_kwargs: dict = {}
    if uid is not None:
        setpriv = find_setpriv()
        if setpriv is not None:
            argv = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *SETPRIV_HARDENING, *argv]
        else:
            user_kwargs = {"user": uid, "group": gid, "extra_groups": []}
    if no_network:
        argv = [*network_off_prefix(), *argv]
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        process_group=0, close_fds=True, **user_kwargs,
    )
    return _Started(proc.pid, proc.stdout.fileno(), proc.stderr.fileno(), proc.wait), proc


def _start_spawned(argv: list[str], cwd: str, env: dict[str, str], spawner: Spawner) -> _Started:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        spawned = spawner.spawn(argv, env, cwd, out_w, err_w)
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return _Started(spawned.pid, out_r, err_r, spawned.exit_status)


def run_process(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    timeout: float,
    stdout_cap: int,
    stderr_cap: int,
    uid: int | None = None,
    gid: int | None = None,
    cancel: threading.Event | None = None,
    spawner: Spawner | None = None,
    no_network: bool = False,
) -> ProcessOutcome:
    """Run ``argv`` and wait for it, the deadline or ``cancel``; kill everything it started.

    With a ``spawner`` (of the workspace user ``uid``) the command is started by it; otherwise directly, switching to
    ``uid``/``gid`` when given. A ``SpawnerError`` means nothing was started and the caller may start it directly.
    """
    started = time.monotonic()
    proc = None
    if spawner is not None:
        handle = _start_spawned(argv, cwd, env, spawner)
    else:
        handle, proc = _start_direct(argv, cwd, env, uid, gid, no_network)
    pgid = handle.pid
    keep = frozenset({spawner.pid}) if spawner is not None else frozenset()
    notes: list[str] = []
    buffers = {handle.out_fd: bytearray(), handle.err_fd: bytearray()}
    caps = {handle.out_fd: stdout_cap, handle.err_fd: stderr_cap}
    omitted = {fd: 0 for fd in buffers}
    selector = selectors.DefaultSelector()
    for fd in buffers:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    try:
        pidfd: int | None = os.pidfd_open(handle.pid)
        selector.register(pidfd, selectors.EVENT_READ)
    except ProcessLookupError:  # already gone (and reaped by the spawner)
        pidfd = None
    deadline = started + timeout
    timed_out = cancelled = swept = False
    exited = pidfd is None
    open_pipes = set(buffers)
    drain_until = time.monotonic() + defaults.KILL_GRACE_SECONDS if exited else 0.0
    try:
        while open_pipes or not exited:
            now = time.monotonic()
            if not exited:
                if cancel is not None and cancel.is_set() and not cancelled:
                    cancelled = True
                    _kill_everything(pgid, pidfd, uid, keep)
                if now >= deadline and not timed_out:
                    timed_out = True
                    _kill_everything(pgid, pidfd, uid, keep)
                if timed_out or cancelled:
                    wait = 0.01  # killed: the exit notice is moments away
                else:
                    wait = deadline - now if cancel is None else min(deadline - now, 0.05)
            elif now < drain_until:
                wait = drain_until - now
            elif uid is not None and not swept:
                # The pipes outlived the group kill: a child left the group. Find it by its user id.
                kill_user_processes(uid, keep)
                swept = True
                drain_until = now + defaults.KILL_GRACE_SECONDS
                continue
            else:
                notes.append("a detached process kept the output pipes open; they were closed")
                break
            for key, _ in selector.select(wait):
                fd = key.fd
                if fd == pidfd:
                    selector.unregister(pidfd)
                    exited = True
                    # The command is done: whatever it left running in its group goes too.
                    _kill_group(pgid)
                    drain_until = time.monotonic() + defaults.KILL_GRACE_SECONDS
                    continue
                try:
                    chunk = os.read(fd, READ_BYTES)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(fd)
                    open_pipes.discard(fd)
                    continue
                buf = buffers[fd]
                room = caps[fd] - len(buf)
                if room > 0:
                    buf += chunk[:room]
                omitted[fd] += max(len(chunk) - max(room, 0), 0)
    finally:
        selector.close()
        if pidfd is not None:
            os.close(pidfd)
        if not exited:
            _kill_group(pgid)
        returncode = handle.status()
        if proc is not None:
            proc.stdout.close()
            proc.stderr.close()
        else:
            os.close(handle.out_fd)
            os.close(handle.err_fd)
    if returncode is None:
        notes.append("the exit status was lost (the spawner stopped); reported as killed")
        returncode = -signal.SIGKILL
    if timed_out:
        exit_code = TIMEOUT_EXIT_CODE
    elif returncode < 0:
        exit_code = 128 - returncode
    else:
        exit_code = returncode
    out_fd, err_fd = handle.out_fd, handle.err_fd
    return ProcessOutcome(
        stdout=bytes(buffers[out_fd]), stderr=bytes(buffers[err_fd]),
        stdout_omitted=omitted[out_fd], stderr_omitted=omitted[err_fd],
        exit_code=exit_code, timed_out=timed_out, cancelled=cancelled,
        duration_ms=int((time.monotonic() - started) * 1000), notes=notes,
    )


def _kill_everything(pgid: int, pidfd: int | None, uid: int | None, keep: frozenset[int]) -> None:
    """On timeout or cancel: the group, the command itself even if it moved to another group, and, with a
    workspace user, every process of that user (but its spawner)."""
    _kill_group(pgid)
    if pidfd is not None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    if uid is not None:
        kill_user_processes(uid, keep)


@functools.cache
def network_off_prefix() -> tuple[str, ...]:
    """What to run a command under so it has no network: a new, empty network namespace (root only)."""
    unshare = shutil.which("unshare", path=defaults.SANDBOX_PATH + ":/usr/sbin:/sbin")
    if unshare is None:
        raise RuntimeUnavailableError("util-linux unshare is needed to run commands without network")
    return (unshare, "--net", "--")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_user_processes(uid: int, keep: frozenset[int] = frozenset()) -> int:
    """SIGKILL every process whose user id is ``uid`` (but the pids in ``keep``); return how many were signalled."""
    killed = 0
    for _ in range(3):  # a process may fork while we look; look again
        found = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat().st_uid != uid or int(entry.name) in keep:
                    continue
                os.kill(int(entry.name), signal.SIGKILL)
                found += 1
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        killed += found
        if not found:
            break
    return killed
