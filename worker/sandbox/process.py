"""Running one shell command as a process group, with a deadline, resource limits and capped output.

The command runs as ``bash -c`` (not a login shell) in a new process group, started directly, by the
workspace's spawner, or handed to a ready shell; with a sandbox, inside bubblewrap (a sandbox of its own, or the
workspace's held sandbox: ``worker.sandbox.held``), placed in its control group before it starts. Resource
limits are applied by ``ulimit`` in that shell before the command, so they need no ``preexec_fn`` and cannot be
raised again by an unprivileged user. The started command is followed on the event loop and ended with
everything it started by ``watch.CommandWatch``; one in a sandbox of its own as soon as bwrap reports its end,
while bwrap and the namespaces are still ending (``ProcessOutcome.gone`` says when they have).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import resource
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable

from worker import defaults
from worker.cancellation import Cancellation
from worker.sandbox.cgroups.groups import RunCgroup
from worker.contract import RunLimits
from worker.errors import RuntimeUnavailableError
from worker.sandbox.fdwait import wait_readable
from worker.sandbox.launcher import Launcher
from worker.sandbox.orphans import ORPHANS, reap_adopted
from worker.outcome import TIMEOUT_EXIT_CODE, ProcessOutcome
from worker.sandbox.ready_shell import ReadyShell
from worker.sandbox.bubblewrap import SandboxSpec, SandboxStart, find_bwrap
from worker.sandbox.spawner import Spawner
from worker.workspaces.user_ids import SETPRIV_HARDENING, find_setpriv
from worker.sandbox.command_watch import CommandWatch, hold_mounts

GONE_TIMEOUT_SECONDS = 5.0
"""How long ``ProcessOutcome.gone`` waits for a sandbox's init to end, at most (its processes are all SIGKILLed)."""

_ULIMIT_FLAGS = (
    # (bash flag, resource, field of RunLimits, divisor to bash's unit)
    ("-t", resource.RLIMIT_CPU, "cpu_seconds", 1),
    ("-f", resource.RLIMIT_FSIZE, "file_size_bytes", 1024),
    ("-n", resource.RLIMIT_NOFILE, "open_files", 1),
)
_MEMORY = ("-d", resource.RLIMIT_DATA, "memory_bytes", 1024)
"""Each process's memory where nothing else bounds it: the data limit, which counts what a process may write
(heap, private writable mappings) and not what it only reserves, as Chromium and V8 (Node) reserve tens of GiB at
start (an address-space limit stops them)."""


def find_bash() -> str:
    bash = shutil.which("bash", path=defaults.SANDBOX_PATH) or shutil.which("bash")
    if bash is None:
        raise RuntimeUnavailableError("bash is not installed; the local runtime runs commands with bash")
    return bash


def ulimit_prefix(limits: RunLimits, *, dedicated_user: bool, memory: bool = False) -> str:
    """A ``ulimit`` line that lowers soft and hard limits to ``limits`` (never above the current hard limit).

    The process-count limit is applied only for a dedicated user: it counts every process of the user, so on a
    developer's own account it would count their whole desktop. Each process's memory (``memory_bytes``, as its
    data limit: ``_MEMORY``) only with ``memory``, where no control group bounds the run's memory.
    """
    parts = []
    flags = list(_ULIMIT_FLAGS)
    if memory:
        flags.append(_MEMORY)
    if dedicated_user:
        flags.append(("-u", resource.RLIMIT_NPROC, "processes", 1))
    for flag, res, field, divisor in flags:
        wanted = getattr(limits, field)
        _, hard = resource.getrlimit(res)
        if hard != resource.RLIM_INFINITY:
            wanted = min(wanted, hard)
        parts.append(f"{flag} {max(wanted // divisor, 1)}")
    return f"ulimit -S -H {' '.join(parts)} || exit 125; "


MAX_ARG_BYTES = 128 * 1024
"""Linux's cap on one argument of a program, its NUL counted (``MAX_ARG_STRLEN``)."""
_PART_CHARS = MAX_ARG_BYTES // 4 - 1
"""A part of a long script: one argument at most, at 4 bytes a character."""


def shell_argv(bash: str, script: str) -> list[str]:
    """``bash -c script``. A script longer than one argument may be is given in parts, joined and evaluated with
    no positional parameters, as ``bash -c`` would run it whole."""
    if len(script) < _PART_CHARS or len(script.encode("utf-8", "surrogatepass")) < MAX_ARG_BYTES:
        return [bash, "-c", script]
    parts = [script[at:at + _PART_CHARS] for at in range(0, len(script), _PART_CHARS)]
    joined = "".join(f"${{{n}}}" for n in range(1, len(parts) + 1))
    return [bash, "-c", f'eval "set --; {joined}"', bash, *parts]


def remote_ulimit_prefix(limits: RunLimits) -> str:
    """A ``ulimit`` line for a shell on another machine, whose hard limits are not known here: each limit is
    lowered to ``limits``, or to that machine's hard limit where that is lower (the sandbox user is dedicated, so
    the process count is limited too; each process's memory too: nothing else bounds a run's memory there). Builtins
    only: no process is started for it."""
    flags = [*_ULIMIT_FLAGS, _MEMORY, ("-u", resource.RLIMIT_NPROC, "processes", 1)]
    return "".join(
        f"{{ ulimit -S -H {flag} {max(getattr(limits, field) // divisor, 1)} || ulimit -S {flag} hard; }} 2>/dev/null; "
        for flag, _, field, divisor in flags
    )


class _Started:
    """A command being started: the read ends of its pipes, its pid once known (also its process group), how to
    get its exit status once it has exited, how to release what the host holds for it, and, for a command in a
    sandbox of its own, the sandbox's start (still blocked, until placed in its control group) and a future done
    once bwrap and its init are reaped (after ``release``)."""

    def __init__(
        self,
        out_fd: int,
        err_fd: int,
        pid: Callable[[], Awaitable[int]],
        status: Callable[[], Awaitable[int | None]],
        release: Callable[[], None],
        sandbox: SandboxStart | None = None,
        reaped: asyncio.Future[None] | None = None,
    ) -> None:
        self.out_fd = out_fd
        self.err_fd = err_fd
        self.pid = pid
        self.status = status
        self.release = release
        self.sandbox = sandbox
        self.reaped = reaped


def _start_direct(
    argv: list[str], cwd: str, env: dict[str, str], uid: int | None, gid: int | None, no_network: bool,
    sandbox: SandboxSpec | None, launcher: Launcher | None = None,
) -> _Started:
    """Start the command as a child of this process, or have ``launcher`` (in the run's control group already)
    become it."""
    user_kwargs: dict = {}
    start = launcher.start if launcher is not None else SandboxStart() if sandbox is not None else None
    if start is not None:
        fds = launcher.fds if launcher is not None else start.child_fds()
        argv = [*sandbox.argv(find_bwrap(), fds=fds, cwd=cwd, env=env if launcher else None), *argv]
    if uid is not None:
        setpriv = find_setpriv()
        if setpriv is not None:
            argv = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *SETPRIV_HARDENING,
                    *argv]
        else:
            user_kwargs = {"user": uid, "group": gid, "extra_groups": []}
    if no_network and sandbox is None:  # a sandbox has a network namespace of its own (bwrap's)
        argv = [*network_off_prefix(), *argv]
    if start is not None:
        ORPHANS.hold()  # bwrap's init may outlive its monitor: adopted until both are reaped (``release``)
    try:
        if launcher is not None:
            launcher.launch(argv, cwd)
            proc = launcher.proc
        else:
            try:
                proc = subprocess.Popen(
                    argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, process_group=0, close_fds=True,
                    pass_fds=start.child_fds() if start is not None else (), **user_kwargs,
                )
            except BaseException:
                if start is not None:
                    start.close()
                raise
    except BaseException:
        if start is not None:
            ORPHANS.let_go()
        raise
    if start is not None and launcher is None:
        start.sent()

    async def pid() -> int:
        return proc.pid

    async def status() -> int:
        return proc.wait()  # called once its pidfd reported the exit: reaping a zombie does not block

    loop = asyncio.get_running_loop()
    reaped = loop.create_future() if start is not None else None

    def ended() -> None:
        """bwrap and its init are reaped (once, from any thread)."""
        if start is not None:
            ORPHANS.let_go()
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_settle, reaped)

    def release() -> None:
        proc.stdout.close()
        proc.stderr.close()
        init = os.dup(start.init_pidfd) if start is not None and start.init_pidfd >= 0 else -1
        if proc.poll() is None or not _reaped(init, block=False):
            # bwrap said how the command ended before its own exit (or the caller gave up), or its init, adopted,
            # is still ending: reaped by a thread when they end, as this loop may be idle by then (a queue worker
            # between jobs)
            threading.Thread(target=_reap, args=(proc, init, ended), name=f"reap-{proc.pid}", daemon=True).start()
        else:
            ended()

    return _Started(proc.stdout.fileno(), proc.stderr.fileno(), pid, status, release, start, reaped)


def _reap(proc: subprocess.Popen, init: int, ended: Callable[[], None]) -> None:
    """Reap a sandbox's bwrap (its monitor), then its init if the monitor left it to this process, then say so
    (``ended``; blocks: a thread's)."""
    proc.wait()
    _reaped(init, block=True)
    ended()


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _reaped(init: int, *, block: bool) -> bool:
    """Whether a sandbox's init (a descriptor of it, closed once reaped; -1: none) is reaped, by its monitor or
    here (``worker.sandbox.orphans.reap_adopted``), once the monitor is."""
    if init < 0:
        return True
    if not reap_adopted(init, block=block):
        return False
    os.close(init)
    return True


def _start_spawned(argv: list[str], cwd: str, env: dict[str, str], spawner: Spawner) -> _Started:
    """Send the command to the spawner; its pid comes while the caller sets up."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        spawned = spawner.send(argv, env, cwd, out_w, err_w)
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)

    def release() -> None:
        os.close(out_r)
        os.close(err_r)
        spawned.close()

    return _Started(out_r, err_r, spawned.started, spawned.exit_status, release)


async def run_process(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    timeout: float,
    stdout_cap: int,
    stderr_cap: int,
    uid: int | None = None,
    gid: int | None = None,
    cancel: Cancellation | None = None,
    spawner: Spawner | None = None,
    ready: ReadyShell | None = None,
    no_network: bool = False,
    sandbox: SandboxSpec | None = None,
    cgroup: RunCgroup | None = None,
    launcher: Launcher | None = None,
) -> ProcessOutcome:
    """Run ``argv`` and wait for it, the deadline or ``cancel``; kill everything it started.

    With a ``spawner`` (of the workspace user ``uid``, outside a sandbox) the command is started by it; otherwise
    directly, switching to ``uid``/``gid`` when given. With ``ready``, a ready shell of a spawner already handed
    its command, the command is that shell (``argv`` is not used); a shell of a held sandbox is in ``cgroup``
    already, every process left there is killed when it ends, and the result comes once that group is empty
    (``worker.sandbox.held``). With ``sandbox`` the command runs in that bubblewrap sandbox of its own, placed in
    ``cgroup`` before it starts, or born there: started by ``launcher``, waiting in ``cgroup`` already
    (``worker.sandbox.launcher``). A ``SpawnerError`` means nothing ran and the caller may start the command directly.
    """
    started = time.monotonic()
    held = ready is not None and ready.sandbox is not None
    if ready is not None:
        handle = _Started(ready.out_fd, ready.err_fd, ready.spawned.started, ready.spawned.exit_status, ready.release)
    elif spawner is not None:
        handle = _start_spawned(argv, cwd, env, spawner)
    elif launcher is not None:
        try:
            handle = _start_direct(argv, cwd, env, uid, gid, no_network, sandbox, launcher)
        except BrokenPipeError:  # it died while it waited (nothing ran): the sandbox is started without it
            launcher.discard()
            launcher = None
            handle = _start_direct(argv, cwd, env, uid, gid, no_network, sandbox)
        except BaseException:  # nothing ran in it, nor is to
            launcher.discard()
            raise
    else:
        handle = _start_direct(argv, cwd, env, uid, gid, no_network, sandbox)
    try:
        # In a sandbox, ending its init or emptying the run's control group ends everything of the run: no sweep by
        # user id, which would reach the workspace's spawner and next ready shell (and any process of that id
        # elsewhere on the host).
        sandboxed = sandbox is not None or held
        watch = CommandWatch(
            handle.out_fd, handle.err_fd, caps=(stdout_cap, stderr_cap), deadline=started + timeout,
            uid=None if sandboxed else uid, keep=frozenset({spawner.pid}) if spawner is not None else frozenset(),
            cancel=cancel, group=cgroup if sandboxed else None,
        )
        gone = None
        try:
            watch.follow(await handle.pid())
            if handle.sandbox is not None:
                await handle.sandbox.release(cgroup if launcher is None else None,
                                             connect=sandbox.network or sandbox.served)
            if handle.sandbox is not None and handle.sandbox.init_pidfd >= 0:
                watch.end_on_report(handle.sandbox)
                gone = asyncio.ensure_future(_ended(os.dup(handle.sandbox.init_pidfd), hold_mounts(handle.sandbox),
                                                    handle.reaped))
            await watch.finished
            returncode = watch.reported if watch.reported is not None else await handle.status()
        finally:
            await watch.close()
            lingering = held and not await watch.emptied()
    finally:
        handle.release()
        if handle.sandbox is not None:
            handle.sandbox.close()
    notes = watch.notes
    if returncode is None:
        notes.append("the exit status was lost (the spawner stopped); reported as killed")
        returncode = -signal.SIGKILL
    if watch.timed_out:
        exit_code = TIMEOUT_EXIT_CODE
    elif returncode < 0:
        exit_code = 128 - returncode
    else:
        exit_code = returncode
    (stdout, stdout_omitted), (stderr, stderr_omitted) = watch.output(handle.out_fd), watch.output(handle.err_fd)
    return ProcessOutcome(
        stdout=stdout, stderr=stderr, stdout_omitted=stdout_omitted, stderr_omitted=stderr_omitted,
        exit_code=exit_code, timed_out=watch.timed_out, cancelled=watch.cancelled,
        duration_ms=int((time.monotonic() - started) * 1000), notes=notes, gone=gone, lingering=lingering,
    )


async def _ended(init_pidfd: int, mounts: int, reaped: asyncio.Future[None] | None) -> None:
    """Wait until a sandbox's init has ended (the kernel has then ended everything in its PID namespace) and it and
    bwrap are reaped (``reaped``: no zombie of the run is left to hold a place of its group's ``pids.max``), a
    while at most, then let its mount namespace go (``watch.hold_mounts``) in a thread; both descriptors are this
    wait's own."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GONE_TIMEOUT_SECONDS
    try:
        if await wait_readable(init_pidfd, GONE_TIMEOUT_SECONDS) and reaped is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reaped), max(deadline - loop.time(), 0))
    finally:
        os.close(init_pidfd)
        if mounts >= 0:
            await asyncio.get_running_loop().run_in_executor(None, os.close, mounts)


@functools.cache
def network_off_prefix() -> tuple[str, ...]:
    """What to run a command under so it has no network: a new, empty network namespace (root only)."""
    unshare = shutil.which("unshare", path=defaults.SANDBOX_PATH + ":/usr/sbin:/sbin")
    if unshare is None:
        raise RuntimeUnavailableError("util-linux unshare is needed to run commands without network")
    return (unshare, "--net", "--")
