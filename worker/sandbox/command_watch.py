"""Following a started command on the event loop, and ending it with everything it started.

The command's pipes and a pidfd of it are read by the loop's own selector, with a timer for the deadline, so no
thread stands between a command and its caller. When the command ends, times out or is cancelled, its whole
process group is killed (in a sandbox of its own, that takes its init and so its PID namespace; in a held
sandbox, every process of the run's control group is killed too); when the command runs as a dedicated user
without a sandbox, a child that left the group (``setsid``) and still holds the pipes is found and killed by its
user id.

A sandboxed command's end is taken from bwrap's report (``end_on_report``), which comes as soon as the sandbox's
init has reaped the command: the init is killed there and then, and with it everything left in the run's PID
namespace; the result waits for the init's end, but not for bwrap's monitor (it holds the pipes open until it has
exited, and tells the spawner, which tells the host) nor for the teardown of the sandbox's mounts
(``hold_mounts``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
import time

from worker import defaults
from worker.cancellation import Cancellation
from worker.errors import SandboxError
from worker.sandbox.cgroups.groups import RunCgroup
from worker.sandbox.fdwait import readable_now
from worker.sandbox.bubblewrap import SandboxStart

READ_BYTES = 64 * 1024
SPLICE_BYTES = 1024 * 1024
READS_PER_TURN = 16
"""Reads of one pipe per event-loop turn, at most."""
FREE_DROP_BYTES = 64 * 1024 * 1024
DROP_PAUSE_SECONDS = 0.02
"""Past its cap, a pipe drops ``FREE_DROP_BYTES`` at full speed, then is drained once per pause."""
LATE_NOTE = "processes of the run were still ending when its result was taken; they were killed"
LATE_TURNS = 4
"""Turns of reads (``READS_PER_TURN`` each) a pipe gets at most when a sandboxed command has ended but some process
of the run outlived the grace period: more than a pipe holds by default, and a process still writing cannot make
them go on."""


class CommandWatch:
    """Follows a command on the event loop: reads its pipes into capped buffers from the start, and once its pid is
    known (``follow``) notices its exit through a pidfd; enforces the deadline and ``cancel``, and kills what the
    command leaves behind.

    ``finished`` is done when the command has exited and its pipes are closed, or when a process that left the
    group kept them open past the grace period (then the pipes are given up, with a note). When the command runs
    as a workspace user, such a process is first looked for by its user id and killed. A sandboxed command may
    end earlier, on its sandbox's report (``end_on_report``); then ``reported`` is its exit code."""

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
        group: RunCgroup | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._pgid: int | None = None
        self._pidfd: int | None = None
        self._uid = uid
        self._keep = keep
        self._cancel = cancel
        self.finished: asyncio.Future[None] = self._loop.create_future()
        self.timed_out = self.cancelled = self.exited = False
        self.reported: int | None = None
        self.notes: list[str] = []
        self._buffers = {out_fd: bytearray(), err_fd: bytearray()}
        self._caps = dict(zip(self._buffers, caps))
        self._omitted = {fd: 0 for fd in self._buffers}
        self._open = set(self._buffers)
        self._swept = False
        self._sweeps: list[asyncio.Future] = []
        self._drain: asyncio.TimerHandle | None = None
        self._paused: dict[int, asyncio.TimerHandle] = {}
        self._sandbox: SandboxStart | None = None
        self._init_ending = False
        self._group = group
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

    def end_on_report(self, sandbox: SandboxStart) -> None:
        """End the sandboxed command when bwrap reports how it ended (``SandboxStart.exit_code``), if that comes
        before bwrap's own exit: then the sandbox's init is SIGKILLed and, once it has ended (the kernel has then
        killed and reaped every process left in its PID namespace, whatever it did to detach), the pipes are read
        to where they stand (all the command wrote is there: it has exited) and the watch is finished, with the
        exit code in ``reported``. An init not ended within the grace period (a process of the run that takes long
        to die) is not waited for further: what the run's group holds is killed too, with a note."""
        self._sandbox = sandbox
        self._loop.add_reader(sandbox.info_r, self._on_report)

    def _on_report(self) -> bool:
        """Whether bwrap's report has ended the command (now, or before)."""
        sandbox = self._sandbox
        code = sandbox.exit_code()
        if code is None:
            if sandbox.report_closed:  # bwrap ended without a word: its exit says how the command ended
                self._loop.remove_reader(sandbox.info_r)
            return False
        self._loop.remove_reader(sandbox.info_r)
        if self.exited or self.timed_out or self.cancelled:
            return self.reported is not None
        self.exited = True
        self.reported = code
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(sandbox.init_pidfd, signal.SIGKILL)
        if readable_now(sandbox.init_pidfd):  # most often it has ended already, by itself
            self._read_last()
        else:
            # The pipes may reach their end first (the init closes its files before the kernel ends the rest of
            # its namespace): the watch finishes on the init's end alone.
            self._init_ending = True
            self._loop.add_reader(sandbox.init_pidfd, self._read_last)
            self._drain = self._loop.call_later(defaults.KILL_GRACE_SECONDS, self._on_init_late)
        return True

    def _on_init_late(self) -> None:
        self._kill_members()
        self.notes.append(LATE_NOTE)
        self._read_last(LATE_TURNS)

    def _read_last(self, turns: int | None = None) -> None:
        """The sandboxed command and the run's processes have ended: take what the pipes hold (nothing writes to
        them any more: bwrap's monitor, which holds them open until it exits, writes nothing) and finish."""
        self._loop.remove_reader(self._sandbox.init_pidfd)
        self._init_ending = False
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None
        for timer in self._paused.values():
            timer.cancel()
        self._paused.clear()
        for fd in list(self._open):
            self._loop.remove_reader(fd)
            for _ in range(turns or sys.maxsize):
                if not self._read(fd):
                    break
        self._open.clear()
        self._settle()

    def output(self, fd: int) -> tuple[bytes, int]:
        """What was kept of one pipe, and how many bytes past its cap were not."""
        return bytes(self._buffers[fd]), self._omitted[fd]

    def _read(self, fd: int) -> bool:
        """Take what the pipe holds now (up to its end, or ``READS_PER_TURN`` reads, after which the loop's other
        work gets its turn and the selector calls again); whether it may hold more.

        Past its cap, a pipe's bytes are counted and dropped in the kernel (spliced to /dev/null); once more than
        ``FREE_DROP_BYTES`` were dropped, the pipe is drained only every ``DROP_PAUSE_SECONDS``, so a run flooding
        its output (and it alone: it waits for its pipe) slows down instead of costing the worker a core."""
        buf = self._buffers[fd]
        more = True
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
                more = False
                break
            if not taken:
                self._loop.remove_reader(fd)
                self._open.discard(fd)
                self._settle()
                return False
            self._omitted[fd] += max(taken - max(room, 0), 0)
        if self._omitted[fd] > FREE_DROP_BYTES and not self.exited:
            self._loop.remove_reader(fd)
            self._paused[fd] = self._loop.call_later(DROP_PAUSE_SECONDS, self._resume, fd)
        return more

    def _resume(self, fd: int) -> None:
        self._paused.pop(fd, None)
        if fd in self._open:
            self._loop.add_reader(fd, self._read, fd)

    def _on_exit(self) -> None:
        if self._sandbox is not None and self._on_report():  # bwrap reported before it exited
            return
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
        self.exited = True
        # The command is done: whatever it left running in its group goes too.
        _kill_group(self._pgid)
        # Most often the pipes are at their end by now: read them here rather than in further loop iterations.
        for fd in list(self._open):
            self._read(fd)
        if self._open:  # something of the run holds them: in a held sandbox, all its control group holds goes
            self._kill_members()
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
        self._kill_members()
        self._sweep()

    def _kill_members(self) -> None:
        """SIGKILL every process in the run's control group now (one look: ``emptied`` makes sure)."""
        if self._group is not None:
            kill_members(self._group)

    def _sweep(self) -> None:
        if self._uid is not None:
            self._sweeps.append(self._loop.run_in_executor(None, kill_user_processes, self._uid, self._keep))
        elif self._group is not None:
            self._sweeps.append(self._loop.run_in_executor(None, empty_group, self._group))

    async def emptied(self) -> bool:
        """Whether the run's control group holds no process (each one found is killed), once it does or after the
        grace period. Called once the command has been reaped: where it left nothing (the usual case) two reads
        of the group's own files say so (``RunCgroup.empty``), with no thread woken."""
        if self._group is None or self._group.empty():
            return True
        emptied = await self._loop.run_in_executor(None, empty_group, self._group)
        if not emptied:
            self.notes.append(LATE_NOTE)
        return emptied

    def _on_drain_over(self) -> None:
        if not self._open:
            return
        if (self._uid is not None or self._group is not None) and not self._swept:
            # The pipes outlived the group kill: a child left the group. Find it by its user id or control group.
            self._swept = True
            self._sweep()
            self._drain = self._loop.call_later(defaults.KILL_GRACE_SECONDS, self._on_drain_over)
            return
        self.notes.append("a detached process kept the output pipes open; they were closed")
        self._open.clear()
        self._settle()

    def _settle(self) -> None:
        if self.exited and not self._open and not self._init_ending and not self.finished.done():
            self.finished.set_result(None)

    async def close(self) -> None:
        """Stop watching. If the command has not exited (the caller gave up), it and everything it started are
        killed as on a cancel. Returns once the sweeps by user id are done."""
        if not self.exited and self._pgid is not None:
            self._stop("cancelled")
        for fd in self._buffers:
            self._loop.remove_reader(fd)
        if self._sandbox is not None:
            self._loop.remove_reader(self._sandbox.info_r)
            self._loop.remove_reader(self._sandbox.init_pidfd)
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


def hold_mounts(sandbox: SandboxStart) -> int:
    """A descriptor of a released sandbox's mount namespace, or -1. While the host holds it, the namespace outlives
    the sandbox's processes: its teardown (unmounting every bind and tmpfs, the kernel's heaviest work as a sandbox
    ends) is done by whoever closes the descriptor, off the run's path, instead of by the init's exit."""
    try:
        fd = os.open(f"/proc/{sandbox.init_pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        signal.pidfd_send_signal(sandbox.init_pidfd, 0)  # the init lives: the pid was still its own
    except OSError:
        os.close(fd)
        return -1
    return fd


def kill_members(group: RunCgroup) -> int:
    """SIGKILL every process ``group`` holds now; how many were signalled."""
    pids = group.procs()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def empty_group(group: RunCgroup) -> bool:
    """Kill what ``group`` holds until it holds nothing (a process may fork while it is looked at; none can leave
    the group, and a killed one forks no more), waiting a little for the killed to end; whether it is empty
    (blocks: a thread's)."""
    deadline = time.monotonic() + defaults.KILL_GRACE_SECONDS
    while kill_members(group):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def kill_user_processes(uid: int, keep: frozenset[int] = frozenset()) -> int:
    """SIGKILL every process whose user id is ``uid`` (but the pids in ``keep``); return how many were signalled.
    Never this process's own user's, nor root's: ``uid`` must be a workspace user's (``SandboxError`` otherwise)."""
    if uid in (0, os.geteuid()):
        raise SandboxError(f"refused to kill every process of uid {uid}: it is not a workspace user's")
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
