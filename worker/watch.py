"""Following a started command on the event loop, and ending it with everything it started.

The command's pipes and a pidfd of it are read by the loop's own selector, with a timer for the deadline, so no
thread stands between a command and its caller. When the command ends, times out or is cancelled, its whole
process group is killed (in a sandbox, that takes its init and so its PID namespace); when the command runs as a
dedicated user, a child that left the group (``setsid``) and still holds the pipes is found and killed by its
user id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time

from worker import defaults
from worker.cancellation import Cancellation

READ_BYTES = 64 * 1024
SPLICE_BYTES = 1024 * 1024
READS_PER_TURN = 16
"""Reads of one pipe per event-loop turn, at most."""
FREE_DROP_BYTES = 64 * 1024 * 1024
DROP_PAUSE_SECONDS = 0.02
"""Past its cap, a pipe drops ``FREE_DROP_BYTES`` at full speed, then is drained once per pause."""


class CommandWatch:
    """Follows a command on the event loop: reads its pipes into capped buffers from the start, and once its pid is
    known (``follow``) notices its exit through a pidfd; enforces the deadline and ``cancel``, and kills what the
    command leaves behind.

    ``finished`` is done when the command has exited and its pipes are closed, or when a process that left the
    group kept them open past the grace period (then the pipes are given up, with a note). When the command runs
    as a workspace user, such a process is first looked for by its user id and killed."""

    def __init__(
        self,
        out_fd: int,
        err_fd: int,
        *,
        caps: tuple[int, int],
        deadline: float,
        uid: int | None,
        keep: frozenset[int],
        cancel: Cancellation | None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._pgid: int | None = None
        self._pidfd: int | None = None
        self._uid = uid
        self._keep = keep
        self._cancel = cancel
        self.finished: asyncio.Future[None] = self._loop.create_future()
        self.timed_out = self.cancelled = self.exited = False
        self.notes: list[str] = []
        self._buffers = {out_fd: bytearray(), err_fd: bytearray()}
        self._caps = dict(zip(self._buffers, caps))
        self._omitted = {fd: 0 for fd in self._buffers}
        self._open = set(self._buffers)
        self._swept = False
        self._sweeps: list[asyncio.Future] = []
        self._drain: asyncio.TimerHandle | None = None
        self._paused: dict[int, asyncio.TimerHandle] = {}
        for fd in self._buffers:
            os.set_blocking(fd, False)
            self._loop.add_reader(fd, self._read, fd)
        self._deadline = self._loop.call_later(max(deadline - time.monotonic(), 0.0), self._stop, "timed_out")
        if cancel is not None:
            cancel.on_set(self._on_cancel)

    def follow(self, pid: int) -> None:
        """Watch the started command ``pid`` (its process group too); a stop asked for before it was known now
        takes effect."""
        self._pgid = pid
        try:
            self._pidfd = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone (and reaped by the spawner)
            self._on_exit()
            return
        self._loop.add_reader(self._pidfd, self._on_exit)
        if self.timed_out or self.cancelled:
            self._kill()

    def output(self, fd: int) -> tuple[bytes, int]:
        """What was kept of one pipe, and how many bytes past its cap were not."""
        return bytes(self._buffers[fd]), self._omitted[fd]

    def _read(self, fd: int) -> None:
        """Take what the pipe holds now (up to its end, or ``READS_PER_TURN`` reads, after which the loop's other
        work gets its turn and the selector calls again).

        Past its cap, a pipe's bytes are counted and dropped in the kernel (spliced to /dev/null); once more than
        ``FREE_DROP_BYTES`` were dropped, the pipe is drained only every ``DROP_PAUSE_SECONDS``, so a run flooding
        its output (and it alone: it waits for its pipe) slows down instead of costing the worker a core."""
        buf = self._buffers[fd]
        for _ in range(READS_PER_TURN):
            room = self._caps[fd] - len(buf)
            try:
                if room > 0:
                    chunk = os.read(fd, READ_BYTES)
                    taken = len(chunk)
                    buf += chunk[:room]
                else:
                    taken = os.splice(fd, _devnull(), SPLICE_BYTES, flags=os.SPLICE_F_NONBLOCK)
            except BlockingIOError:
                break
            if not taken:
                self._loop.remove_reader(fd)
                self._open.discard(fd)
                self._settle()
                return
            self._omitted[fd] += max(taken - max(room, 0), 0)
        if self._omitted[fd] > FREE_DROP_BYTES and not self.exited:
            self._loop.remove_reader(fd)
            self._paused[fd] = self._loop.call_later(DROP_PAUSE_SECONDS, self._resume, fd)

    def _resume(self, fd: int) -> None:
        self._paused.pop(fd, None)
        if fd in self._open:
            self._loop.add_reader(fd, self._read, fd)

    def _on_exit(self) -> None:
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
        self.exited = True
        # The command is done: whatever it left running in its group goes too.
        _kill_group(self._pgid)
        # Most often the pipes are at their end by now: read them here rather than in further loop iterations.
        for fd in list(self._open):
            self._read(fd)
        if self._open:
            self._drain = self._loop.call_later(defaults.KILL_GRACE_SECONDS, self._on_drain_over)
        self._settle()

    def _on_cancel(self) -> None:
        self._stop("cancelled")

    def _stop(self, why: str) -> None:
        if self.exited or self.timed_out or self.cancelled:
            return
        setattr(self, why, True)
        self._kill()

    def _kill(self) -> None:
        """On timeout or cancel: the group, the command itself even if it moved to another group, and, with a
        workspace user, every process of that user (but its spawner). Before the pid is known, ``follow`` does it."""
        if self._pgid is None:
            return
        _kill_group(self._pgid)
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        self._sweep()

    def _sweep(self) -> None:
        if self._uid is not None:
            self._sweeps.append(self._loop.run_in_executor(None, kill_user_processes, self._uid, self._keep))

    def _on_drain_over(self) -> None:
        if not self._open:
            return
        if self._uid is not None and not self._swept:
            # The pipes outlived the group kill: a child left the group. Find it by its user id.
            self._swept = True
            self._sweep()
            self._drain = self._loop.call_later(defaults.KILL_GRACE_SECONDS, self._on_drain_over)
            return
        self.notes.append("a detached process kept the output pipes open; they were closed")
        self._open.clear()
        self._settle()

    def _settle(self) -> None:
        if self.exited and not self._open and not self.finished.done():
            self.finished.set_result(None)

    async def close(self) -> None:
        """Stop watching. If the command has not exited (the caller gave up), it and everything it started are
        killed as on a cancel. Returns once the sweeps by user id are done."""
        if not self.exited and self._pgid is not None:
            self._stop("cancelled")
        for fd in self._buffers:
            self._loop.remove_reader(fd)
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
        self._deadline.cancel()
        if self._drain is not None:
            self._drain.cancel()
        for timer in self._paused.values():
            timer.cancel()
        if self._cancel is not None:
            self._cancel.remove(self._on_cancel)
        if self._sweeps:
            await asyncio.gather(*self._sweeps, return_exceptions=True)


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


@functools.cache
def _devnull() -> int:
    """Where output past its cap goes (opened once, kept open)."""
    return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
