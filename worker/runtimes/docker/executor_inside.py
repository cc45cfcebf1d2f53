"""The executor inside a workspace's container: its first process, which starts each run's command for the worker
and ends everything the run left. It runs with the image's ``python3`` (standard library only, Python 3.8+) and
imports nothing of Skillrun: the worker mounts this file read-only into the container.

It starts as the container's root holding only ``CAP_SETUID``, ``CAP_SETGID``, ``CAP_SETPCAP`` and ``CAP_KILL``
(no-new-privileges). Its control folder (``/.skillrun/control``, the worker's on the host) is mounted below
``/.skillrun``, a file system of root's that no other user may enter, so only the executor reaches it: it reads
the container's token there and listens on ``sock`` acting as the folder's owner (on a root worker root, on any
other the worker's user, who is also the workspace's), makes the root's folders on the way to its mounts under
``/tmp`` closed to others, then empties its capability bounding set and becomes a user of its own for good — not
the workspace's — keeping ``CAP_SETUID``, ``CAP_SETGID`` and ``CAP_KILL`` (``executor_confine``). From then on it is
process 1 of the container's PID namespace and another user than every command it starts: a command of the
workspace can neither signal it (not even ``SIGSTOP``, which gVisor would deliver to a namespace's init), trace
it, read its memory, nor reach its socket or token, whoever the worker runs as. A client proves it knows the
container's token before anything else.

The protocol is frames: a type byte, three zero bytes, the payload's length (32-bit big-endian), the payload. The
worker sends ``AUTH`` (the token), then ``RUN`` (JSON: ``script`` for ``bash -c``, ``env``, ``cwd``, ``caps`` on
stdout and stderr bytes, ``scrub``: the script that empties the scratch folders) and, to end a run early,
``KILL``. The executor answers ``READY`` to ``AUTH``, streams the command's output as frames 1 (stdout) and 2
(stderr) up to the caps (reading and counting the rest, so it never stops answering), and ends each run with
``EXIT`` (JSON: ``code``, ``omitted``, ``clean``, ``ready``) once every process of the run is gone —
``kill(-1, SIGKILL)`` from process 1 reaches every other process of the container, however it detached — and
``/tmp``, ``/dev/shm`` and ``/dev/mqueue`` hold nothing of its user (emptied as that user). A run whose client goes
away is ended the same way. After a run it starts the next run's bash (a *ready shell*, with this run's variables
and folder, waiting for its script on stdin), so a run that fits skips bash's start-up. Runs take turns (the
worker's): a ``RUN`` while another is under way is refused with ``ERROR``.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import json
import os
import selectors
import shlex
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback

try:
    from worker.runtimes.docker import executor_confine as confine  # in the worker, which reads this module's constants
except ImportError:  # in a container: the program's folder holds it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import executor_confine as confine

STDOUT, STDERR, EXIT, READY, ERROR = 1, 2, 3, 4, 5
AUTH, RUN, KILL = 16, 17, 18
HEADER = struct.Struct(">B3xI")
CONTROL = "/.skillrun/control"
TOKEN_FILE = "token"
SOCKET_FILE = "sock"
READY_VARIABLE = "__skillrun_command"
READY_LOADER = f'unset {READY_VARIABLE}; source /dev/stdin && exec 0</dev/null && eval "${READY_VARIABLE}"'
"""What a ready shell runs: read its script from stdin to the end (the run's own variables, and the command in a
variable), take ``/dev/null`` as stdin like any run, then run the command at top level (as under ``bash -c``)."""
RUN_VARIABLES = frozenset({"RUN_DIR", "HOME", "TMPDIR"})
"""The variables that differ from one run of a workspace to the next (a ready shell gets them with its script)."""
MAX_CLIENTS = 8
MAX_FRAME = 16 * 1024 * 1024
DRAIN_SECONDS = 2.0
READ_BYTES = 65536


class Client:
    """A connection from the worker: frames in, frames out (blocking sends: the worker reads them as they come)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = b""
        self.trusted = False

    def frames(self, data: bytes):
        """The whole frames received so far (a frame too large closes the connection)."""
        self.pending += data
        while len(self.pending) >= HEADER.size:
            kind, size = HEADER.unpack_from(self.pending)
            if size > MAX_FRAME:
                raise ValueError("frame too large")
            if len(self.pending) < HEADER.size + size:
                return
            payload = self.pending[HEADER.size : HEADER.size + size]
            self.pending = self.pending[HEADER.size + size :]
            yield kind, payload

    def send(self, kind: int, payload: bytes = b"") -> bool:
        try:
            self.sock.sendall(HEADER.pack(kind, len(payload)) + payload)
            return True
        except OSError:
            return False


class Run:
    """One command under way: its process, its output pipes and what of its output was sent."""

    def __init__(self, client: Client, process: subprocess.Popen, caps: list[int], scrub: str, env: dict[str, str],
                 cwd: str) -> None:
        self.client = client
        self.scrub = scrub
        self.env = env
        self.cwd = cwd
        self.process = process
        self.pipes = {process.stdout.fileno(): STDOUT, process.stderr.fileno(): STDERR}
        self.room = {STDOUT: caps[0], STDERR: caps[1]}
        self.omitted = {STDOUT: 0, STDERR: 0}
        self.status: int | None = None
        self.killed = False


class Executor:
    """The executor's loop; ``uid``:``gid`` is the workspace's user, which every command runs as."""

    def __init__(self, token: bytes, server: socket.socket, uid: int, gid: int) -> None:
        self.token = token
        self.uid = uid
        self.gid = gid
        self.selector = selectors.DefaultSelector()
        self.clients: list[Client] = []
        self.run: Run | None = None
        self.ready: tuple[subprocess.Popen, dict[str, str], str] | None = None  # bash waiting for the next run
        self.wakeup_r, wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wakeup_w)
        # Every signal it can catch wakes the loop through the pipe and does nothing else (a run, another user, may
        # send none but SIGCONT, to a process of its session: belts and braces). Handlers, unlike ignored signals,
        # are not inherited by the commands it starts.
        for number in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(number, _no_op)
        self.selector.register(self.wakeup_r, selectors.EVENT_READ, "wakeup")
        self.selector.register(server, selectors.EVENT_READ, "server")

    def serve(self) -> None:
        while True:
            try:
                self._step()
            except Exception:  # noqa: BLE001 - a bug here must end the run, not the container
                traceback.print_exc()
                if self.run is not None:
                    self._kill()
                    self._finish()

    def _step(self) -> None:
        for key, _ in self.selector.select(timeout=None if self.run is None else 1.0):
            if key.data == "wakeup":
                self._drain_wakeups()
                self._reap()
            elif key.data == "server":
                self._accept(key.fileobj)
            elif isinstance(key.data, Client):
                self._receive(key.data)
            else:
                self._output(key.fileobj, key.data)
        if self.run is not None and self.run.status is not None:
            self._finish()

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wakeup_r, 512):
                pass
        except BlockingIOError:
            pass

    def _reap(self) -> None:
        """Collect every ended child: the run's command (its status kept) and orphans of the run."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.run is not None and pid == self.run.process.pid:
                self.run.status = self.run.process.returncode = exit_code(status)

    def _accept(self, server: socket.socket) -> None:
        sock, _ = server.accept()
        sock.setblocking(True)
        if len(self.clients) >= MAX_CLIENTS:
            idle = next((c for c in self.clients if self.run is None or c is not self.run.client), None)
            if idle is None:
                sock.close()
                return
            self._close(idle)
        client = Client(sock)
        self.clients.append(client)
        self.selector.register(sock, selectors.EVENT_READ, client)

    def _close(self, client: Client) -> None:
        if client not in self.clients:
            return
        self.selector.unregister(client.sock)
        client.sock.close()
        self.clients.remove(client)
        if self.run is not None and self.run.client is client:
            self._kill()  # nobody follows the run any more: end it

    def _receive(self, client: Client) -> None:
        if client not in self.clients:
            return
        try:
            data = client.sock.recv(READ_BYTES)
        except OSError:
            data = b""
        if not data:
            self._close(client)
            return
        try:
            for kind, payload in client.frames(data):
                self._handle(client, kind, payload)
        except (ValueError, KeyError, TypeError) as exc:
            client.send(ERROR, f"bad frame: {exc}".encode())
            self._close(client)

    def _handle(self, client: Client, kind: int, payload: bytes) -> None:
        if not client.trusted:
            if kind != AUTH or not hmac.compare_digest(payload, self.token):
                raise ValueError("not authenticated")
            client.trusted = True
            client.send(READY, json.dumps({"pid": os.getpid(), "uid": os.getuid()}).encode())
        elif kind == RUN:
            if self.run is not None:
                client.send(ERROR, b"a run is under way")
                return
            self._start(client, json.loads(payload))
        elif kind == KILL:
            if self.run is not None and self.run.client is client:
                self._kill()

    def _start(self, client: Client, spec: dict) -> None:
        """Start the run: its script goes, on stdin, to the ready shell when that fits the run, else to a shell
        started now the same way (so a script of any length up to the worker's limit is taken alike)."""
        env = {str(k): str(v) for k, v in spec["env"].items()}
        cwd, script = str(spec["cwd"]), str(spec["script"])
        process = self._take_ready(env, cwd)
        problem = ""
        if process is None:
            try:
                process = self._spawn_shell(env, cwd)
            except (OSError, subprocess.SubprocessError) as exc:
                problem = str(exc)
        if process is not None and not self._feed(process, env, script):
            self._end_shell(process)
            process, problem = None, "its shell ended before it took the command"
        if process is None:
            client.send(STDERR, f"cannot start the command: {problem}\n".encode())
            clean = confine.clean_up(self.uid, self.gid, spec["scrub"])
            report = {"code": 127, "omitted": [0, 0], "clean": clean, "ready": False}
            client.send(EXIT, json.dumps(report).encode())
            return
        self.run = Run(client, process, [int(cap) for cap in spec["caps"]], str(spec["scrub"]), env, cwd)
        for fd in self.run.pipes:
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ, self.run)
        self._reap()  # a command that ended before its pipes were watched

    def _take_ready(self, env: dict[str, str], cwd: str) -> subprocess.Popen | None:
        """The waiting ready shell when it fits the run (same folder, same variables but the run's own);
        otherwise it is ended and ``None`` returned."""
        ready, self.ready = self.ready, None
        if ready is None:
            return None
        process, ready_env, ready_cwd = ready
        fits = ready_cwd == cwd and without_run_variables(ready_env) == without_run_variables(env)
        if fits and process.poll() is None:
            return process
        self._end_shell(process)
        return None

    def _spawn_shell(self, env: dict[str, str], cwd: str) -> subprocess.Popen:
        """A bash of the workspace's user, with no capability, with ``env`` in ``cwd``, that reads its script from
        stdin (``READY_LOADER``). It is made acting as that user: the executor itself may not enter the workspace,
        and the pipes are then the user's, which its commands may open again (``/dev/stdin``, ``/dev/stderr``)."""
        with confine.acting_as(self.uid, self.gid):
            return subprocess.Popen(
                ["/bin/bash", "-c", READY_LOADER], env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, close_fds=True, restore_signals=True,
                preexec_fn=functools.partial(confine.become_user, self.uid, self.gid),  # noqa: PLW1509 - one thread
            )

    @staticmethod
    def _feed(process: subprocess.Popen, env: dict[str, str], script: str) -> bool:
        """Give a shell its script (the run's own variables, and the command); ``False`` if it is gone."""
        exports = " ".join(f"{name}={shlex.quote(env[name])}" for name in sorted(RUN_VARIABLES & env.keys()))
        try:
            process.stdin.write(f"export {exports}; SECONDS=0; {READY_VARIABLE}={shlex.quote(script)}\n".encode())
            process.stdin.close()
            return True
        except OSError:
            return False

    def _end_shell(self, process: subprocess.Popen) -> None:
        with contextlib.suppress(OSError):
            process.kill()
        for stream in (process.stdin, process.stdout, process.stderr):
            with contextlib.suppress(OSError):
                stream.close()
        self._reap()

    def _make_ready(self, env: dict[str, str], cwd: str) -> None:
        """Start bash for the next run, with this run's variables and folder, waiting for its script on stdin."""
        try:
            self.ready = (self._spawn_shell(env, cwd), env, cwd)
        except (OSError, subprocess.SubprocessError):
            self.ready = None

    def _output(self, fd: int, run: Run) -> None:
        if fd not in run.pipes:
            return
        try:
            chunk = os.read(fd, READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.selector.unregister(fd)
            del run.pipes[fd]
            return
        stream = run.pipes[fd]
        kept = chunk[: max(run.room[stream], 0)]
        run.room[stream] -= len(kept)
        run.omitted[stream] += len(chunk) - len(kept)
        if kept:
            run.client.send(stream, kept)

    def _kill(self) -> None:
        """End the run now: every process of the container but this one is killed."""
        run = self.run
        if run is None or run.killed:
            return
        run.killed = True
        confine.kill_all()
        self._reap()
        if run.status is None:
            run.status = 128 + signal.SIGKILL  # killed before its exit was seen (it is reaped below)

    def _finish(self) -> None:
        """The run's command has ended: end every process it left, read what they wrote, empty the scratch folders,
        report."""
        run = self.run
        confine.kill_all()
        deadline = time.monotonic() + DRAIN_SECONDS
        while run.pipes and time.monotonic() < deadline:
            self._reap()
            for fd in list(run.pipes):
                self._output(fd, run)
            if run.pipes:
                time.sleep(0.001)
        for fd in list(run.pipes):
            self.selector.unregister(fd)
        run.process.stdout.close()
        run.process.stderr.close()
        self.run = None
        self._reap()
        report = {"code": run.status, "omitted": [run.omitted[STDOUT], run.omitted[STDERR]],
                  "clean": confine.clean_up(self.uid, self.gid, run.scrub), "ready": True}
        if run.client in self.clients:
            run.client.send(EXIT, json.dumps(report).encode())
        self._make_ready(run.env, run.cwd)  # after the report: the run does not wait for it


def _no_op(*_: object) -> None:
    """A signal's handler: the loop's wakeup pipe has had its byte."""


def without_run_variables(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name not in RUN_VARIABLES}


def exit_code(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128 plus the signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def open_control() -> tuple[bytes, socket.socket]:
    """As the container's root: the container's token, and the server socket listening on ``sock``, both in the
    control folder as its owner (root lacks ``CAP_DAC_OVERRIDE`` here, and a socket made by the owner is the
    owner's to connect to, also when gVisor makes it on the host)."""
    folder = os.open(CONTROL, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    owner = os.fstat(folder)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with confine.acting_as(owner.st_uid, owner.st_gid):
            os.fchdir(folder)
            with open(TOKEN_FILE, "rb") as f:  # the worker's, mode 0600
                token = f.read().strip()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(SOCKET_FILE)
            server.bind(SOCKET_FILE)
            os.chdir("/")
    finally:
        os.close(folder)
    server.listen(MAX_CLIENTS)
    return token, server


def ids(text: str) -> tuple[int, int]:
    """``uid:gid`` as numbers."""
    uid, gid = (int(part) for part in text.split(":"))
    return uid, gid


def main() -> None:
    (uid, gid), (own_uid, own_gid) = ids(sys.argv[1]), ids(sys.argv[2])
    if 0 in (uid, own_uid) or uid == own_uid:
        sys.exit(f"executor: the workspace's user ({uid}) must be neither root nor the executor's ({own_uid})")
    token, server = open_control()
    if not token:
        sys.exit(f"executor: no token in {CONTROL}/{TOKEN_FILE}")
    confine.close_paths_to_mounts()
    executor = Executor(token, server, uid, gid)
    confine.become_executor(own_uid, own_gid)
    executor.serve()


if __name__ == "__main__":
    main()
