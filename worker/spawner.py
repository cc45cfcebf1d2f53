"""Spawner: a small helper process per workspace that starts its commands as the workspace user.

Switching user per run costs the large host process a ``fork`` (``Popen(user=...)`` cannot use ``vfork``) or an
extra ``exec`` (``setpriv``): milliseconds per run. A spawner is started once per workspace through ``setpriv``
(workspace user and group, no supplementary groups, no-new-privileges, empty capability bounding set) and runs a
tiny standard-library-only loop: for each request it ``posix_spawn``s the command in a new process group with the
pipes it was handed, and it reports each child's exit status. It holds nothing the command could not already
reach: it runs as the same unprivileged user. The host process keeps every kill (it is root and signals the
process group) and every deadline.

Wire format. Host → spawner, over ``SOCK_SEQPACKET``, one JSON object per message: ``{"argv", "env", "cwd"}``
with three descriptors as ``SCM_RIGHTS``: the stdout and stderr write ends and the write end of a control pipe
of that run, and optionally more that become the child's descriptors 3, 4 (a ready shell's script pipe, and
the pipe it closes once started). The spawner answers on the control pipe, one JSON line each: ``{"pid": n}``
(or ``{"error": "..."}``) at once, then ``{"exited": pid, "status": code}`` when it reaps the child (``status`` as
``os.waitstatus_to_exitcode``: negative for a signal), and closes it. The run's event loop reads its control pipe
directly: no thread stands between a command and its caller. The socket itself carries only
``{"ready": true}`` once, and its end tells that the spawner stopped.

Ready shells (``ReadyShell``): after a run, the spawner starts bash for the workspace's next run ahead of time,
in a sandbox of its own (``worker.sandbox``) that the caller places in a control group while it waits; the next
run that fits hands it its script, skipping the round trip above, bash's start-up and the sandbox's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shlex
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from worker.cgroups import CgroupError, RunCgroup
from worker.errors import WorkerError
from worker.fdwait import wait_readable
from worker.sandbox import SandboxError, SandboxSpec, SandboxStart, find_bwrap

MAX_MESSAGE_BYTES = 64 * 1024
"""The largest request a spawner takes (it receives into a buffer of this size every time); a larger command or
environment is started directly instead."""
MAX_DESCRIPTORS = 8
"""The most descriptors one request hands the spawner: the two output pipes, the control pipe and up to five
more for the command (a ready shell's script and start pipes, its sandbox's report, block and seccomp pipes)."""
READY_TIMEOUT_SECONDS = 5.0
REPLY_TIMEOUT_SECONDS = 5.0
STATUS_TIMEOUT_SECONDS = 5.0

SPAWNER_SOURCE = r"""
import fcntl, json, os, select, signal, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
os.set_inheritable(sock.fileno(), False)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *a: None)
controls = {}
def tell(fd, obj, last=False):
    try:
        os.write(fd, json.dumps(obj).encode() + b"\n")
    except OSError:
        pass
    if last:
        os.close(fd)
sock.send(json.dumps({"ready": True}).encode())
while True:
    try:
        ready, _, _ = select.select([sock, wake_r], [], [])
    except InterruptedError:
        continue
    if wake_r in ready:
        os.read(wake_r, 4096)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in controls:
                tell(controls.pop(pid), {"exited": pid, "status": os.waitstatus_to_exitcode(status)}, last=True)
    if sock in ready:
        data, fds, _, _ = socket.recv_fds(sock, %(max)d, %(fds)d)
        if not data:
            break
        for fd in fds:
            os.set_inheritable(fd, False)
        if len(fds) < 3:
            for fd in fds:
                os.close(fd)
            continue
        control = fds[2]
        # The child's descriptors 3, 4, ... come from copies above any of those numbers, so that no dup2 overwrites
        # a descriptor still to be copied (and each target is a fresh copy, open across the exec).
        extra = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in fds[3:]]
        try:
            req = json.loads(data)
            os.chdir(req["cwd"])
            actions = [
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fds[0], 1),
                (os.POSIX_SPAWN_DUP2, fds[1], 2),
            ] + [(os.POSIX_SPAWN_DUP2, fd, 3 + i) for i, fd in enumerate(extra)]
            pid = os.posix_spawn(
                req["argv"][0], req["argv"], req["env"], file_actions=actions, setpgroup=0,
                setsigdef=(signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ),
            )
            controls[pid] = control
            tell(control, {"pid": pid})
        except Exception as exc:
            tell(control, {"error": f"{type(exc).__name__}: {exc}"}, last=True)
        finally:
            for fd in fds[:2] + fds[3:] + extra:
                os.close(fd)
            os.chdir("/")
""" % {"max": MAX_MESSAGE_BYTES, "fds": MAX_DESCRIPTORS}


READY_SHELL_VARIABLE = "__skillrun_command"
READY_SHELL_LOADER = f'exec 4>&-; source /proc/self/fd/3 && eval "${READY_SHELL_VARIABLE}"'
"""What a ready shell runs: say it has started (close descriptor 4), read its script (one short file: the run's
variables and the command in a variable), then run the command at top level."""
RUN_VARIABLES = frozenset({"RUN_DIR", "HOME", "TMPDIR"})
"""The variables that differ from one run of a workspace to the next (a ready shell gets them with its script)."""


class SpawnerError(WorkerError):
    """The spawner could not start a command; the caller may fall back to starting it directly."""


def spawner_python() -> str | None:
    """A Python interpreter that an unprivileged user can run (the system one first)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if _executable_by_others(Path(candidate)):
            return candidate
    return None


def _executable_by_others(path: Path) -> bool:
    try:
        real = path.resolve(strict=True)
        if not os.stat(real).st_mode & stat.S_IXOTH:
            return False
        return all(os.stat(folder).st_mode & stat.S_IXOTH for folder in real.parents)
    except OSError:
        return False


class Spawner:
    """The host side of one workspace's spawner process."""

    def __init__(
        self, uid: int, gid: int, *, setpriv: str, python: str, hardening: tuple[str, ...], prefix: tuple[str, ...] = ()
    ) -> None:
        """``prefix`` runs before ``setpriv`` (as root), e.g. ``unshare --net --`` for commands without network."""
        self.uid = uid
        self.gid = gid
        host_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        host_sock.setblocking(False)
        self._sock = host_sock
        try:
            self._proc = subprocess.Popen(
                [*prefix, setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *hardening,
                 python, "-I", "-S", "-c", SPAWNER_SOURCE, str(child_sock.fileno())],
                pass_fds=[child_sock.fileno()], env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd="/",
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0,
            )
        finally:
            child_sock.close()
        self._ready = threading.Event()
        self._alive = True
        self._shell: ReadyShell | None = None
        self._reader = threading.Thread(target=self._watch, name=f"spawner-{uid}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def ready(self) -> bool:
        return self._alive and self._ready.is_set()

    @property
    def alive(self) -> bool:
        return self._alive

    def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> bool:
        return self._ready.wait(timeout) and self._alive

    def send(
        self, argv: list[str], env: dict[str, str], cwd: str, stdout_fd: int, stderr_fd: int, *more_fds: int
    ) -> "Spawned":
        """Ask for ``argv`` to be started as the workspace user in a new process group, its output on the given
        descriptors (and ``more_fds`` as its descriptors 3, 4, …); ``Spawned.started`` then gives its pid.

        Never waits: the socket does not block (a spawner that stopped taking commands is given up), so the
        caller can set up while the spawner starts the command."""
        if not self.ready:
            raise SpawnerError("the spawner is not running")
        message = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        if len(message) > MAX_MESSAGE_BYTES:
            raise SpawnerError("the command and its environment are too large for the spawner")
        control_r, control_w = os.pipe()
        try:
            socket.send_fds(self._sock, [message], [stdout_fd, stderr_fd, control_w, *more_fds])
        except OSError as exc:
            os.close(control_r)
            self.shut()
            raise SpawnerError(f"the spawner did not take the command: {exc}") from exc
        finally:
            os.close(control_w)
        return Spawned(self, control_r)

    def prepare_shell(
        self, bash: str, env: dict[str, str], cwd: str, sandbox: SandboxSpec | None = None
    ) -> "ReadyShell | None":
        """Have a ready shell (``ready_shell``) wait for this workspace's next run, in place of any other; the new
        shell, if one could be started."""
        old, self._shell = self._shell, None
        if old is not None:
            old.discard()
        if self.ready:
            with contextlib.suppress(SpawnerError):
                self._shell = self.ready_shell(bash, env, cwd, sandbox)
        return self._shell

    @property
    def waiting_shell(self) -> "ReadyShell | None":
        """The ready shell waiting for the next run, if any."""
        return self._shell

    def take_shell(self) -> "ReadyShell | None":
        """The ready shell waiting for the next run, if any (it is the caller's from now on)."""
        shell, self._shell = self._shell, None
        return shell

    def ready_shell(
        self, bash: str, env: dict[str, str], cwd: str, sandbox: SandboxSpec | None = None
    ) -> "ReadyShell":
        """Start a shell for a command not known yet: bash started now, with ``env`` in ``cwd``, waiting on its
        descriptor 3 for the script (``ReadyShell.start``). In a ``sandbox``, the shell starts once placed
        (``ReadyShell.place``)."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        script_r, script_w = os.pipe()
        up_r, up_w = os.pipe()
        start = SandboxStart() if sandbox is not None else None
        argv = [bash, "-c", READY_SHELL_LOADER]
        try:
            # bash reopens it through /proc as the workspace user: its group may read it, nobody of it may write
            # (another process of the workspace could otherwise slip its own script in through /proc/<pid>/fd/3).
            os.fchown(script_r, -1, self.gid)
            os.fchmod(script_r, 0o440)
            if start is not None:  # the sandbox's ends become the shell's descriptors 5, 6 and 7
                argv = [*sandbox.argv(find_bwrap(), fds=(5, 6, 7), cwd=cwd), *argv]
            spawned = self.send(argv, env, cwd, out_w, err_w, script_r, up_w,
                                *(start.child_fds() if start is not None else ()))
        except BaseException:
            for fd in (out_r, err_r, script_w, up_r):
                os.close(fd)
            if start is not None:
                start.close()
            raise
        finally:
            for fd in (out_w, err_w, script_r, up_w):
                os.close(fd)
        if start is not None:
            start.sent()
        return ReadyShell(spawned, env, cwd, out_r, err_r, script_w, up_r, sandbox=sandbox, start=start)

    def close(self) -> None:
        """Stop the spawner and reap it. Blocks (up to two seconds): async code calls it through a thread."""
        self.shut()
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def shut(self) -> None:
        """Close the socket, which tells the spawner to stop; does not wait for it. A ready shell is given up."""
        self._alive = False
        shell = self.take_shell()
        if shell is not None:
            shell.discard()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _watch(self) -> None:
        """Notice the spawner's ready message, and its end."""
        try:
            while True:
                select.select([self._sock], [], [])
                try:
                    data = self._sock.recv(MAX_MESSAGE_BYTES)
                except BlockingIOError:
                    continue
                if not data:
                    break
                if json.loads(data).get("ready"):
                    self._ready.set()
        except (OSError, ValueError):
            pass
        finally:
            self._alive = False


class Spawned:
    """One command sent to a spawner: its pid once started, and its control pipe, read on the run's event loop."""

    def __init__(self, spawner: Spawner, control_fd: int) -> None:
        self.pid = 0
        os.set_blocking(control_fd, False)
        self._spawner = spawner
        self._fd = control_fd
        self._pending = b""
        self._starting: asyncio.Future[int] | None = None

    async def started(self) -> int:
        """The command's pid once the spawner has started it. ``SpawnerError`` if it refused or did not answer
        (then nothing runs, and a spawner that did not answer is given up). Callers that ask at once share one
        read of the reply."""
        if self.pid:
            return self.pid
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._read_pid())
        return await asyncio.shield(self._starting)

    async def _read_pid(self) -> int:
        reply = await self.next_message(REPLY_TIMEOUT_SECONDS)
        if reply is None or "pid" not in reply:
            self.close()
            if reply is None:
                self._spawner.shut()
            raise SpawnerError((reply or {}).get("error", "the spawner did not answer"))
        self.pid = int(reply["pid"])
        return self.pid

    async def next_message(self, timeout: float) -> dict | None:
        """The next line the spawner wrote about this command, or ``None`` at its end or after ``timeout``."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            try:
                chunk = os.read(self._fd, 4096)
            except BlockingIOError:
                if not await wait_readable(self._fd, deadline - time.monotonic()):
                    return None
                continue
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    async def exit_status(self, timeout: float = STATUS_TIMEOUT_SECONDS) -> int | None:
        """The exit status (negative for a signal) once the spawner has reaped the command; ``None`` if it
        stopped first."""
        message = await self.next_message(timeout)
        self.close()
        return int(message["status"]) if message and "status" in message else None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class ReadyShell:
    """A bash started ahead of its command, so a warm run skips the spawner's round trip and bash's start-up.

    It was started as the workspace user in a process group of its own, with the environment and folder of the
    workspace's last run, reading its descriptor 3. ``start`` writes one short script there, in one atomic pipe
    write: it exports the run's own ``RUN_DIR``, ``HOME`` and ``TMPDIR``, resets ``SECONDS`` and holds the command
    in a shell variable, which the shell then runs with ``eval`` at top level (where line numbers, ``return`` and
    error messages behave as under ``bash -c``). A shell that is not used is discarded: its pipe closes, it reads
    nothing, runs nothing and exits.

    A shell in a sandbox waits, blocked, until ``place`` has put it in its control group (``cgroup``), which it
    keeps for its run; ``on_release`` is called once the host has let go of the shell (to remove that group)."""

    def __init__(
        self, spawned: Spawned, env: dict[str, str], cwd: str, out_fd: int, err_fd: int, script_fd: int, up_fd: int,
        *, sandbox: SandboxSpec | None = None, start: SandboxStart | None = None,
    ) -> None:
        self.spawned = spawned
        self.env = env
        self.cwd = cwd
        self.folder = _identity(cwd)
        self.out_fd = out_fd
        self.err_fd = err_fd
        self._script = script_fd
        os.set_blocking(up_fd, False)
        self._up = up_fd
        self.sandbox = sandbox
        self.cgroup: RunCgroup | None = None
        self.on_release: Callable[["ReadyShell"], None] | None = None
        self.placement: asyncio.Task | None = None  # the caller's task running ``place``
        self._start = start
        self._placing = False
        self._placed = False
        self._discarded = False

    @property
    def placed(self) -> bool:
        """Whether the shell can take a run: it needs no placing, or it was placed."""
        return self._start is None or (self._placed and not self._discarded)

    async def place(self, cgroup: RunCgroup | None) -> bool:
        """Put the sandboxed shell in ``cgroup`` and let it start; ``False`` if that failed (it is then discarded).
        A shell discarded meanwhile is let go here, once the sandbox's pipes are no longer watched."""
        if self._start is None or self._placing or self._discarded:
            return False
        self._placing = True
        placed = False
        try:
            await self.spawned.started()
            await self._start.release(cgroup)
            placed = self._start.init_pid > 0
        except (SandboxError, CgroupError, SpawnerError, OSError):
            placed = False
        finally:
            self._placing = False
        if placed:
            self.cgroup = cgroup
            self._placed = True
        if not placed or self._discarded:
            self._kill_unplaced()
            self.discard()
        return placed and not self._discarded

    def _kill_unplaced(self) -> None:
        """A shell that was not placed must not start outside its group: kill its sandbox before letting go."""
        if self.spawned.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.spawned.pid, signal.SIGKILL)

    async def wait_up(self, timeout: float = READY_TIMEOUT_SECONDS) -> bool:
        """Wait until the shell has started and waits for its script (or has gone); ``False`` after ``timeout``."""
        if self._up < 0:
            return True
        if not await wait_readable(self._up, timeout):
            return False
        os.close(self._up)
        self._up = -1
        return True

    def fits(self, env: dict[str, str], cwd: str, sandbox: SandboxSpec | None = None) -> bool:
        """Whether a run with ``env`` in ``cwd`` can use this shell: the same folder (the same one, not one put in
        its place since: a restaged skill is a new folder), the same environment but for the run's own folder
        variables, so bash started as it would have for this run (what it reads at start-up alone, such as
        ``BASH_ENV``, a request may not set), and the same sandbox, placed."""
        return (
            sandbox == self.sandbox
            and self.placed
            and cwd == self.cwd
            and self.folder is not None
            and _identity(cwd) == self.folder
            and {k: v for k, v in env.items() if k not in RUN_VARIABLES}
            == {k: v for k, v in self.env.items() if k not in RUN_VARIABLES}
        )

    def start(self, command: str, env: dict[str, str]) -> bool:
        """Hand the shell ``command`` to run with ``env``'s run variables. ``False`` if the shell is gone or the
        script would not fit in one atomic pipe write: then nothing ran and the shell is discarded."""
        exports = " ".join(f"{name}={shlex.quote(env[name])}" for name in sorted(RUN_VARIABLES & env.keys()))
        script = f"exec 3<&-; export {exports}; SECONDS=0; {READY_SHELL_VARIABLE}={shlex.quote(command)}\n".encode()
        try:
            if len(script) > select.PIPE_BUF or "\0" in command:
                return False
            os.write(self._script, script)
            return True
        except OSError:  # it was killed (a timeout of another run of the workspace kills every process of its user)
            return False
        finally:
            os.close(self._script)
            self._script = -1

    def discard(self) -> None:
        """Give the shell up: it reads an empty script and exits. While it is being placed, ``place`` finishes
        this."""
        self._discarded = True
        if self._placing:
            return
        if self._start is not None and not self.placed:
            self._kill_unplaced()
        if self._script >= 0:
            os.close(self._script)
            self._script = -1
        self.release()

    def release(self) -> None:
        """Close what this process holds of the shell (after its run, or once discarded)."""
        for fd in (self.out_fd, self.err_fd, self._up):
            if fd >= 0:
                os.close(fd)
        self.out_fd = self.err_fd = self._up = -1
        self.spawned.close()
        if self._start is not None:
            self._start.close()
        callback, self.on_release = self.on_release, None
        if callback is not None:
            callback(self)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino
