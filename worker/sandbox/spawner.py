"""Spawner: a small helper process per workspace that starts its commands as the workspace user.

Switching user per run costs the large host process a ``fork`` (``Popen(user=...)`` cannot use ``vfork``) or an
extra ``exec`` (``setpriv``): milliseconds per run. A spawner is started once per workspace through ``setpriv``
(workspace user and group, no supplementary groups, no-new-privileges, empty capability bounding set) and runs a
tiny standard-library-only loop: for each request it ``posix_spawn``s the command in a new process group with the
pipes it was handed, and it reports each child's exit status. It holds nothing the command could not already
reach: it runs as the same unprivileged user. The host process keeps every kill (it is root and signals the
process group) and every deadline. With the sandbox, the spawner runs in the workspace's held sandbox
(``worker.sandbox.held``) and its commands start there.

Wire format. Host → spawner, over ``SOCK_SEQPACKET``, one JSON object per message: ``{"argv", "env", "cwd", "fresh"}``
with three descriptors as ``SCM_RIGHTS``: the stdout and stderr write ends and the write end of a control pipe
of that run, and optionally more that become the child's descriptors 3, 4 (a ready shell's script pipe, and
the pipe it closes once started). The spawner answers on the control pipe, one JSON line each: ``{"pid": n}``
(or ``{"error": "..."}``) at once, then ``{"exited": pid, "status": code}`` when it reaps the child (``status`` as
``os.waitstatus_to_exitcode``: negative for a signal), and closes it. The run's event loop reads its control pipe
directly: no thread stands between a command and its caller. The socket itself carries only
``{"ready": true}`` once, and its end tells that the spawner stopped.

Ready shells (``ReadyShell``): after a run, the spawner starts bash for the workspace's next run ahead of time
(in a held sandbox, the caller places it in a control group while it waits); the next run that fits hands it its
script, skipping the round trip above and bash's start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

from worker.sandbox import held as held_sandbox
from worker.errors import SpawnerError
from worker.sandbox.fdwait import wait_readable
from worker.sandbox.held import FRESH_SOURCE, HeldStart
from worker.sandbox.ready_shell import READY_SHELL_LOADER, READY_TIMEOUT_SECONDS, ReadyShell, folder_identity
from worker.sandbox.orphans import ORPHANS, reap_adopted
from worker.sandbox.bubblewrap import SandboxSpec, find_bwrap

MAX_MESSAGE_BYTES = 64 * 1024
"""The largest request a spawner takes (it receives into a buffer of this size every time); a larger command or
environment is started directly instead."""
MAX_DESCRIPTORS = 5
"""The most descriptors one request hands the spawner: the two output pipes, the control pipe and up to two
more for the command (a ready shell's script and start pipes)."""
REPLY_TIMEOUT_SECONDS = 5.0
STATUS_TIMEOUT_SECONDS = 5.0

SPAWNER_SOURCE = r"""
import ctypes, fcntl, json, os, select, signal, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
os.set_inheritable(sock.fileno(), False)
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(4, 0, 0, 0, 0)
signal.signal(signal.SIGINT, signal.SIG_IGN)
%(fresh)s
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
            if req.get("fresh") and not fresh():
                raise OSError("what the last run left in /tmp, /dev/shm or IPC objects could not be removed")
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
""" % {"max": MAX_MESSAGE_BYTES, "fds": MAX_DESCRIPTORS, "fresh": FRESH_SOURCE}
"""The spawner's loop. It makes itself non-dumpable (``PR_SET_DUMPABLE`` 0: no process of its user may ptrace it
or open its ``/proc`` descriptors) and ignores SIGINT (in a held sandbox it is the namespace's pid 1, which the
kernel keeps every other signal from a run away from, as it has no handler for them)."""


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
        self, uid: int, gid: int, *, setpriv: str, python: str, hardening: tuple[str, ...], prefix: tuple[str, ...] = (),
        sandbox: SandboxSpec | None = None,
    ) -> None:
        """``prefix`` runs before ``setpriv`` (as root), e.g. ``unshare --net --`` for commands without network.
        With ``sandbox`` the spawner runs in a held sandbox of that spec (``worker.sandbox.held``)."""
        self.uid = uid
        self.gid = gid
        self.sandbox = sandbox
        self.occupied = False
        """A run is in the held sandbox (set and cleared by the runtime): no other run or ready shell goes there."""
        host_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        host_sock.setblocking(False)
        self._sock = host_sock
        self._held = HeldStart() if sandbox is not None else None
        held_argv = self._held_argv()
        pass_fds = [child_sock.fileno(), *(self._held.child_fds() if self._held is not None else ())]
        try:
            self._proc = subprocess.Popen(
                [*prefix, setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *hardening, *held_argv,
                 python, "-I", "-S", "-c", SPAWNER_SOURCE, str(child_sock.fileno())],
                pass_fds=pass_fds, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd="/",
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0,
            )
        except BaseException:
            if self._held is not None:
                self._held.close()
            raise
        finally:
            child_sock.close()
        if self._held is not None:
            self._held.sent()
        self._ready = threading.Event()
        self._alive = True
        self._shell: ReadyShell | None = None
        self._reader = threading.Thread(target=self._watch, name=f"spawner-{uid}", daemon=True)
        self._reader.start()

    def _held_argv(self) -> list[str]:
        if self._held is None:
            return []
        info_fd, seccomp_fd = self._held.child_fds()
        return self.sandbox.held_argv(find_bwrap(), info_fd=info_fd, seccomp_fd=seccomp_fd)

    def host_pid(self, pid: int) -> int:
        """The host pid of the child the spawner reported as ``pid`` (the same, outside a held sandbox)."""
        return pid if self._held is None else held_sandbox.host_pid(self._held.pid, pid)

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
        self, argv: list[str], env: dict[str, str], cwd: str, stdout_fd: int, stderr_fd: int, *more_fds: int,
        fresh: bool = False,
    ) -> "Spawned":
        """Ask for ``argv`` to be started as the workspace user in a new process group, its output on the given
        descriptors (and ``more_fds`` as its descriptors 3, 4, …); ``Spawned.started`` then gives its pid.

        Never waits: the socket does not block (a spawner that stopped taking commands is given up), so the
        caller can set up while the spawner starts the command. ``fresh``: first empty the held sandbox of what
        the last run left (``worker.sandbox.held``); the command is refused if that fails."""
        if not self.ready:
            raise SpawnerError("the spawner is not running")
        message = json.dumps({"argv": argv, "env": env, "cwd": cwd, "fresh": fresh}).encode()
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

    def prepare_shell(self, bash: str, env: dict[str, str], cwd: str) -> "ReadyShell | None":
        """Have a ready shell (``ready_shell``) wait for this workspace's next run, in place of any other; the new
        shell, if one could be started."""
        old, self._shell = self._shell, None
        if old is not None:
            old.discard()
        if self.ready:
            with contextlib.suppress(SpawnerError):
                self._shell = self.ready_shell(bash, env, cwd)
        return self._shell

    @property
    def waiting_shell(self) -> "ReadyShell | None":
        """The ready shell waiting for the next run, if any."""
        return self._shell

    def take_shell(self) -> "ReadyShell | None":
        """The ready shell waiting for the next run, if any (it is the caller's from now on)."""
        shell, self._shell = self._shell, None
        return shell

    def ready_shell(self, bash: str, env: dict[str, str], cwd: str) -> "ReadyShell":
        """Start a shell for a command not known yet: bash started now, with ``env`` in ``cwd``, waiting on its
        descriptor 3 for the script (``ReadyShell.start``). In a held sandbox, emptied of what the last run left
        first; the shell there takes a run once placed in its control group (``ReadyShell.place``)."""
        if self._held is not None and (changed := self._held.changed_settings()):
            self.shut()
            raise SpawnerError(f"a run changed the held sandbox's spawner ({', '.join(changed)}); it is given up")
        folder = folder_identity(cwd)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        script_r, script_w = os.pipe()
        up_r, up_w = os.pipe()
        try:
            # bash reopens it through /proc as the workspace user: its group may read it, nobody of it may write
            # (another process of the workspace could otherwise slip its own script in through /proc/<pid>/fd/3).
            os.fchown(script_r, -1, self.gid)
            os.fchmod(script_r, 0o440)
            spawned = self.send([bash, "-c", READY_SHELL_LOADER], env, cwd, out_w, err_w, script_r, up_w,
                                fresh=self.sandbox is not None)
        except BaseException:
            for fd in (out_r, err_r, script_w, up_r):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w, script_r, up_w):
                os.close(fd)
        return ReadyShell(spawned, env, cwd, out_r, err_r, script_w, up_r, folder=folder, sandbox=self.sandbox)

    def close(self) -> None:
        """Stop the spawner and reap it. Blocks (up to two seconds): async code calls it through a thread. One that
        does not stop is killed; in a held sandbox, its pid 1 is reaped too before this returns."""
        self.shut()
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            if self._held is None:
                self._proc.kill()
                self._proc.wait()
                return
            with ORPHANS.held():  # its pid 1 outlives bwrap's monitor, killed: adopted, and reaped by ``_watch``
                self._proc.kill()
                self._proc.wait()
                self._reader.join()

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
        """Notice the spawner's host pid (in a held sandbox), its ready message, and its end; then, in a held sandbox,
        reap the spawner if its bwrap monitor ended first and left it to this process (``worker.sandbox.orphans.reap_adopted``)."""
        spawner = -1
        try:
            if self._held is not None:
                if not self._held.read_pid():
                    return
                spawner = self._pidfd_of_child(self._held.pid)
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
            if self._held is not None:
                self._held.close()
            if spawner >= 0:
                self._proc.wait()
                reap_adopted(spawner, block=True)
                os.close(spawner)

    def _pidfd_of_child(self, pid: int) -> int:
        """A pidfd of the held sandbox's pid 1 ``pid`` while its monitor is still its parent (so the pid is still its
        own), or -1."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return -1
        try:
            with open(f"/proc/{pid}/stat") as stat_file:
                parent = int(stat_file.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            parent = 0
        if parent == self._proc.pid:
            return pidfd
        os.close(pidfd)
        return -1


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
        try:
            self.pid = self._spawner.host_pid(int(reply["pid"]))
        except SpawnerError:
            self.close()
            raise
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
