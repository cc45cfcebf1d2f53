"""Spawner: a small helper process per workspace that starts its commands as the workspace user.

Switching user per run costs the large host process a ``fork`` (``Popen(user=...)`` cannot use ``vfork``) or an
extra ``exec`` (``setpriv``): milliseconds per run. A spawner is started once per workspace through ``setpriv``
(workspace user and group, no supplementary groups, no-new-privileges, empty capability bounding set) and runs a
tiny standard-library-only loop: for each request it ``posix_spawn``s the command in a new process group with the
pipes it was handed, and it reports each child's exit status. It holds nothing the command could not already
reach: it runs as the same unprivileged user. The host process keeps every kill (it is root and signals the
process group) and every deadline.

Wire format (``SOCK_SEQPACKET``, one JSON object per message): host → spawner
``{"argv", "env", "cwd"}`` with the stdout and stderr write ends as ``SCM_RIGHTS``; spawner → host
``{"ready": true}`` once, ``{"pid": n}`` or ``{"error": "..."}`` per request, ``{"exited": pid, "status": code}``
per child (``status`` as ``os.waitstatus_to_exitcode``: negative for a signal).
"""

from __future__ import annotations

import json
import os
import queue
import socket
import stat
import subprocess
import threading
from pathlib import Path

from worker.errors import WorkerError

MAX_MESSAGE_BYTES = 1024 * 1024
READY_TIMEOUT_SECONDS = 5.0
REPLY_TIMEOUT_SECONDS = 5.0
STATUS_TIMEOUT_SECONDS = 5.0

SPAWNER_SOURCE = r"""
import json, os, select, signal, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
os.set_inheritable(sock.fileno(), False)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *a: None)
def send(obj):
    sock.send(json.dumps(obj).encode())
send({"ready": True})
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
            send({"exited": pid, "status": os.waitstatus_to_exitcode(status)})
    if sock in ready:
        data, fds, _, _ = socket.recv_fds(sock, %(max)d, 2)
        if not data:
            break
        try:
            for fd in fds:
                os.set_inheritable(fd, False)
            req = json.loads(data)
            os.chdir(req["cwd"])
            actions = [
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fds[0], 1),
                (os.POSIX_SPAWN_DUP2, fds[1], 2),
            ]
            pid = os.posix_spawn(
                req["argv"][0], req["argv"], req["env"], file_actions=actions, setpgroup=0,
                setsigdef=(signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ),
            )
            send({"pid": pid})
        except Exception as exc:
            send({"error": f"{type(exc).__name__}: {exc}"})
        finally:
            for fd in fds:
                os.close(fd)
            os.chdir("/")
""" % {"max": MAX_MESSAGE_BYTES}


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
        self._replies: queue.Queue[dict] = queue.Queue()
        self._statuses: dict[int, int] = {}
        self._status_changed = threading.Condition()
        self._spawn_lock = threading.Lock()
        self._ready = threading.Event()
        self._alive = True
        self._reader = threading.Thread(target=self._read, name=f"spawner-{uid}", daemon=True)
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

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, stdout_fd: int, stderr_fd: int) -> int:
        """Start ``argv`` as the workspace user in a new process group; return its pid."""
        if not self.ready:
            raise SpawnerError("the spawner is not running")
        message = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        if len(message) > MAX_MESSAGE_BYTES:
            raise SpawnerError("the command and its environment are too large for the spawner")
        with self._spawn_lock:
            try:
                socket.send_fds(self._sock, [message], [stdout_fd, stderr_fd])
                reply = self._replies.get(timeout=REPLY_TIMEOUT_SECONDS)
            except (OSError, queue.Empty) as exc:
                self.close()
                raise SpawnerError(f"the spawner did not answer: {exc}") from exc
        if "pid" not in reply:
            raise SpawnerError(reply.get("error", "the spawner stopped"))
        return int(reply["pid"])

    def exit_status(self, pid: int, timeout: float = STATUS_TIMEOUT_SECONDS) -> int | None:
        """The exit status of a spawned process (negative for a signal), once the spawner has reaped it."""
        with self._status_changed:
            self._status_changed.wait_for(lambda: pid in self._statuses or not self._alive, timeout)
            return self._statuses.pop(pid, None)

    def close(self) -> None:
        self._alive = False
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _read(self) -> None:
        try:
            while True:
                data = self._sock.recv(MAX_MESSAGE_BYTES)
                if not data:
                    break
                message = json.loads(data)
                if "exited" in message:
                    with self._status_changed:
                        self._statuses[int(message["exited"])] = int(message["status"])
                        self._status_changed.notify_all()
                elif "ready" in message:
                    self._ready.set()
                else:
                    self._replies.put(message)
        except (OSError, ValueError):
            pass
        finally:
            self._alive = False
            self._replies.put({"error": "the spawner stopped"})
            with self._status_changed:
                self._status_changed.notify_all()
