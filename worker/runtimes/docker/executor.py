"""The worker's side of a container's executor (``executor_inside``): its files on the host, the connection to it,
and a run through it.

Every container of the Docker runtime that can (its image has ``python3``) starts the executor as its first
process. The executor's control folder — ``<work root>/.skillrun/executors/<id>/``, the worker's, mode 0700 — is
mounted at ``/.skillrun/control`` and holds its socket and token; the program is a read-only folder,
``<work root>/.skillrun/executors/program-<hash>/`` (``executor_inside`` and ``executor_confine``), mounted at
``/.skillrun/program``. Both are mounted below ``EXECUTOR_MOUNTS``, a tmpfs only root may enter, so no command
reaches them, also where the worker's user (a worker not running as root) owns the control folder and runs the
commands. Both sit under the work root, which a worker in a container shares with the engine at the same path, so a
worker on the host and one in a container reach executors alike.

Trust: a run cannot reach its executor (another user, behind that tmpfs), yet the worker does not rely on it and
takes the executor as part of its workspace's trust domain. The worker opens the socket without following links
(a socket is reached through the folder the worker made, never through a path a command could change), proves the
container's token, and believes of the executor's answers only what the command could have said itself — its
output (capped again here) and its exit status. Whether the run left anything is checked from the host where the
worker can see the container's processes (``container_host.HostView``) and emptied through the engine when it
did; only where it cannot (gVisor, a worker in a container) does the executor's word decide, and a lie then
leaves processes of the workspace in the workspace's own container, within its limits, until it is reaped.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import secrets
import select
import shutil
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from worker.cancellation import Cancellation
from worker.contract import RunRequest
from worker.errors import ExecutorError
from worker.outcome import TIMEOUT_EXIT_CODE, ProcessOutcome
from worker.runtimes.docker import executor_confine as confine
from worker.runtimes.docker import executor_inside as inside
from worker.runtimes.docker.host import CLEAN_INSIDE

EXECUTOR_MOUNTS = "/.skillrun"
"""Where a container mounts its executor's folders: a tmpfs of root's, mode 0700, so only the executor (as root,
before it becomes a user of its own) may enter it."""
CONTROL_MOUNT = inside.CONTROL
PROGRAM_MOUNT = f"{EXECUTOR_MOUNTS}/program"
PROGRAM_FILES = {"executor.py": inside, "executor_confine.py": confine}
"""The executor's program, as its files are named in its folder (``PROGRAM_MOUNT``)."""
PROGRAM = f"{PROGRAM_MOUNT}/executor.py"
CONNECT_SECONDS = 2.0
"""How long connecting and proving the token may take before the executor counts as broken."""
START_SECONDS = 15.0
"""How long a new container's executor may take to listen (an interpreter starting on a busy machine)."""
KILL_ANSWER_SECONDS = 5.0
"""How long an executor may take to end a run it was told to end (kill, drain, empty the scratch folders)."""
POLL_SECONDS = 0.05
SWEEP_AFTER_SECONDS = 60.0


class ExecutorUnavailable(ExecutorError):
    """The executor could not be reached or answered wrongly before a run started (the run did not start)."""


class ExecutorLost(ExecutorError):
    """The executor went away or stopped answering while a run was under way; ``outcome`` is the run's, as far
    as it was seen (set by ``ExecutorLink.run``)."""

    outcome: ProcessOutcome | None = None


@dataclass(frozen=True)
class Report:
    """What an executor says of its container after a run: whether the scratch folders are clean, and whether a
    ready shell (one more process) waits for the next run."""

    clean: bool
    ready: bool


class Frames:
    """Frames of an 8-byte header (type, three zero bytes, big-endian length) read off a stream as they arrive —
    the executor's, and ``docker exec``'s multiplexed output (types 1 and 2)."""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.pending += data
        frames = []
        while len(self.pending) >= inside.HEADER.size:
            kind, size = inside.HEADER.unpack_from(self.pending)
            end = inside.HEADER.size + size
            if len(self.pending) < end:
                break
            frames.append((kind, self.pending[inside.HEADER.size : end]))
            self.pending = self.pending[end:]
        return frames


class CappedOutput:
    """A run's stdout and stderr, kept up to its caps; what goes past them is counted."""

    def __init__(self, request: RunRequest) -> None:
        self.kept = {inside.STDOUT: bytearray(), inside.STDERR: bytearray()}
        self.caps = {inside.STDOUT: request.limits.stdout_bytes, inside.STDERR: request.limits.stderr_bytes}
        self.omitted = {inside.STDOUT: 0, inside.STDERR: 0}

    def add(self, stream: int, payload: bytes) -> None:
        target = inside.STDERR if stream == inside.STDERR else inside.STDOUT
        room = max(self.caps[target] - len(self.kept[target]), 0)
        self.kept[target] += payload[:room]
        self.omitted[target] += max(len(payload) - room, 0)

    def outcome(self, *, exit_code: int, timed_out: bool, cancelled: bool, started: float,
                notes: list[str] | None = None) -> ProcessOutcome:
        return ProcessOutcome(
            stdout=bytes(self.kept[inside.STDOUT]), stderr=bytes(self.kept[inside.STDERR]),
            stdout_omitted=self.omitted[inside.STDOUT], stderr_omitted=self.omitted[inside.STDERR],
            exit_code=exit_code, timed_out=timed_out, cancelled=cancelled,
            duration_ms=int((time.monotonic() - started) * 1000), notes=notes or [],
        )


class ExecutorFiles:
    """The executors' folder under a work root's registry: the program, and one control folder per container."""

    def __init__(self, registry: Path, *, sources: dict[str, bytes] | None = None) -> None:
        """``sources``: the program's files by name, instead of ``PROGRAM_FILES``'."""
        self.folder = registry / "executors"
        self._sources = {name: Path(module.__file__).read_bytes() for name, module in PROGRAM_FILES.items()}
        self._sources.update(sources or {})
        digest = hashlib.sha256(b"".join(name.encode() + b"\0" + text for name, text in sorted(self._sources.items())))
        self.program = self.folder / f"program-{digest.hexdigest()[:12]}"

    def install(self) -> None:
        """Write the program's folder once (atomically; read-only), and the executors' folder (the worker's
        alone)."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.program.exists():
            return
        partial = self.folder / f"{self.program.name}.{secrets.token_hex(4)}.tmp"
        partial.mkdir(mode=0o755)
        for name, text in self._sources.items():
            (partial / name).write_bytes(text)
            (partial / name).chmod(0o444)
        try:
            partial.rename(self.program)
        except OSError:  # another worker installed it meanwhile
            shutil.rmtree(partial, ignore_errors=True)

    def new_control(self) -> tuple[Path, bytes]:
        """A new container's control folder (mode 0700: only the worker's user, and the executor before it becomes
        the workspace's user, enter it) holding a new token (``token``, 0600), and the token."""
        control = self.folder / secrets.token_hex(8)
        control.mkdir(mode=0o700)
        token = secrets.token_hex(32).encode()
        descriptor = os.open(control / inside.TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(descriptor, "wb") as f:
            f.write(token)
        return control, token

    @staticmethod
    def token(control: Path) -> bytes:
        """The token of the container ``control`` belongs to (empty when it cannot be read)."""
        try:
            return (control / inside.TOKEN_FILE).read_bytes().strip()
        except OSError:
            return b""

    def remove_control(self, control: Path) -> None:
        if control.parent == self.folder:
            shutil.rmtree(control, ignore_errors=True)

    def sweep(self, in_use: set[str]) -> None:
        """Remove the control folders no container of this work root names (a worker that died left them) and the
        programs of other versions, but those made in the last minute (a container may be starting with one; a
        worker of another version sharing the work root writes its program again when it next needs it)."""
        settled = time.time() - SWEEP_AFTER_SECONDS
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.folder):
                if (entry.is_dir(follow_symlinks=False) and entry.path not in in_use
                        and entry.path != str(self.program)
                        and entry.stat(follow_symlinks=False).st_mtime < settled):
                    shutil.rmtree(entry.path, ignore_errors=True)


class ExecutorLink:
    """A connection to one container's executor, proven with the container's token."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid  # the executor's process id in its container (1)
        self.frames = Frames()
        self.queue: collections.deque[tuple[int, bytes]] = collections.deque()

    @classmethod
    def connect(cls, control: Path, token: bytes, timeout: float = CONNECT_SECONDS) -> "ExecutorLink":
        """Connect to the socket in ``control`` — opened without following a link, and only if it is a socket —
        and prove the token. ``ExecutorUnavailable`` says why not."""
        try:
            fd = os.open(control / "sock", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ExecutorUnavailable(f"no executor socket ({exc.strerror})") from exc
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                raise ExecutorUnavailable("the executor's socket is not a socket")
            sock.settimeout(timeout)
            sock.connect(f"/proc/self/fd/{fd}")
            link = cls(sock, 0)
            link.send(inside.AUTH, token)
            kind, payload = link.next_frame(time.monotonic() + timeout)
            if kind != inside.READY:
                raise ExecutorUnavailable(f"the executor refused the token ({payload[:200]!r})")
            link.pid = int(json.loads(payload)["pid"])
            sock.settimeout(None)
            return link
        except (OSError, ValueError, KeyError, ExecutorLost) as exc:
            sock.close()
            raise ExecutorUnavailable(f"the executor did not answer ({exc})") from exc
        except BaseException:
            sock.close()
            raise
        finally:
            os.close(fd)

    def send(self, kind: int, payload: bytes = b"") -> None:
        self.sock.sendall(inside.HEADER.pack(kind, len(payload)) + payload)

    def next_frame(self, deadline: float) -> tuple[int, bytes]:
        """The next frame, waiting until ``deadline`` (``ExecutorLost`` when the connection ends or time is up)."""
        while not self.queue:
            if time.monotonic() >= deadline:
                raise ExecutorLost("the executor did not answer in time")
            self.queue.extend(self._read(max(deadline - time.monotonic(), 0)))
        return self.queue.popleft()

    def receive(self, seconds: float) -> list[tuple[int, bytes]]:
        """The frames that came, waiting up to ``seconds`` for some (``ExecutorLost`` once the connection has
        ended)."""
        if self.queue:
            frames = list(self.queue)
            self.queue.clear()
            return frames
        return self._read(seconds)

    def _read(self, seconds: float) -> list[tuple[int, bytes]]:
        if not select.select([self.sock], [], [], seconds)[0]:
            return []
        try:
            data = self.sock.recv(65536)
        except OSError as exc:
            raise ExecutorLost(f"the connection to the executor broke ({exc})") from exc
        if not data:
            raise ExecutorLost("the executor closed the connection")
        return self.frames.feed(data)

    def usable(self) -> bool:
        """Whether the connection is still open and nothing unasked-for is waiting on it (between runs)."""
        try:
            return not self.queue and not select.select([self.sock], [], [], 0)[0]
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        self.sock.close()

    def run(self, script: str, env: dict[str, str], cwd: str, request: RunRequest,
            cancel: Cancellation) -> tuple[ProcessOutcome, Report]:
        """Run ``bash -c script`` through the executor, following it until it ends, times out or is cancelled;
        the outcome, and what the executor reported of the container. ``ExecutorUnavailable`` when the run could
        not be handed over (it did not start), ``ExecutorLost`` when the executor went away during it."""
        output = CappedOutput(request)
        spec = {"script": script, "env": env, "cwd": cwd, "scrub": CLEAN_INSIDE,
                "caps": [request.limits.stdout_bytes, request.limits.stderr_bytes]}
        started = time.monotonic()
        try:
            self.send(inside.RUN, json.dumps(spec).encode())
        except OSError as exc:
            raise ExecutorUnavailable(f"the executor took no run ({exc})") from exc
        deadline = started + request.timeout
        timed_out = cancelled = False
        answer_by: float | None = None
        try:
            while True:
                now = time.monotonic()
                if answer_by is None and (cancel.is_set() or now >= deadline):
                    cancelled, timed_out = cancel.is_set(), not cancel.is_set()
                    answer_by = now + KILL_ANSWER_SECONDS
                    with contextlib.suppress(OSError):
                        self.send(inside.KILL)
                if answer_by is not None and now >= answer_by:
                    raise ExecutorLost("the executor did not end the run when told to")
                until = answer_by if answer_by is not None else deadline
                for kind, payload in self.receive(min(POLL_SECONDS, max(until - now, 0))):
                    if kind in (inside.STDOUT, inside.STDERR):
                        output.add(kind, payload)
                    elif kind == inside.EXIT:
                        report = json.loads(payload)
                        omitted = report.get("omitted", [0, 0])
                        output.omitted[inside.STDOUT] += int(omitted[0])
                        output.omitted[inside.STDERR] += int(omitted[1])
                        code = TIMEOUT_EXIT_CODE if timed_out else int(report["code"])
                        outcome = output.outcome(exit_code=code, timed_out=timed_out, cancelled=cancelled,
                                                 started=started)
                        return outcome, Report(bool(report.get("clean")), bool(report.get("ready")))
                    elif kind == inside.ERROR:
                        raise ExecutorLost(f"the executor refused the run: {payload[:200].decode(errors='replace')}")
        except (ExecutorLost, ValueError, KeyError, TypeError) as exc:
            lost = exc if isinstance(exc, ExecutorLost) else ExecutorLost(f"the executor answered wrongly ({exc})")
            lost.outcome = output.outcome(
                exit_code=TIMEOUT_EXIT_CODE if timed_out else 128 + 9, timed_out=timed_out, cancelled=cancelled,
                started=started, notes=[f"{lost}; the workspace's container was removed, its next run gets a new one"],
            )
            if lost is exc:
                raise
            raise lost from exc


__all__ = [
    "CONTROL_MOUNT", "EXECUTOR_MOUNTS", "PROGRAM", "PROGRAM_MOUNT", "CappedOutput", "ExecutorFiles", "ExecutorLink",
    "ExecutorLost", "ExecutorUnavailable", "Frames", "Report",
]
