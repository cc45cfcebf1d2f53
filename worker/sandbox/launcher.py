"""Launchers: a process waiting in a new run's control group, so the run's sandbox is born there.

Moving a process into a cgroup v1 memory group waits for an RCU grace period (the kernel's cgroup migration lock
is a per-CPU semaphore that its writer must first turn to slow mode): 8–12 ms on a small VM, on a first run's
path when its new sandbox is moved into its group (``SandboxStart.release``). A child is born in its parent's
groups without moving, so a ``Launcher`` — bash as root, waiting for one request (a byte on a pipe, then a file),
its output pipes and a ``SandboxStart``'s ends already given — is started ahead and moved into a spare run group
while nothing waits for it; a run that starts a sandbox of its own (``process.run_process``) sends it its folder
and command line, and it ``exec``s them there: the sandbox, and everything of the run, is born in the run's group.
bwrap sets the command's environment (``--clearenv``, ``--setenv``): the launcher's own (bash's) goes no further
than bwrap, and makes the sandbox's network namespace.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading

from worker.sandbox.cgroups.pool import CgroupPool
from worker.sandbox.cgroups.groups import CgroupError, CgroupLimits, RunCgroup
from worker.sandbox.bubblewrap import SandboxStart

SPARE_LAUNCHERS = 2
"""Launchers kept waiting for runs that start a sandbox of their own (first runs of workspaces)."""

LAUNCHER_SCRIPT = ('IFS= read -r -n 1 _ <&{go} && mapfile -d "" -u {request} argv && exec {go}<&- {request}<&- && '
                   'cd -- "${{argv[0]}}" && exec -- "${{argv[@]:1}}"')
"""What a launcher runs: wait for one byte on the pipe ``go``, then read its folder and command line
(NUL-terminated) from the file ``request`` and become it. The request is a file (a ``memfd``), not the pipe: bash
reads a pipe one byte a system call (it must not read past a delimiter), which cost a launch about 2 ms of CPU for
its few kilobytes; from a file it reads in blocks."""


class Launcher:
    """A root bash in its run group (``cgroup``, made for it), waiting to become a run's sandbox."""

    def __init__(self, bash: str, cgroup: RunCgroup) -> None:
        """Start the launcher and move it into ``cgroup`` (blocks: a thread's, off any run's path)."""
        self.cgroup = cgroup
        self.start = SandboxStart()
        go_r, self._go = os.pipe()
        self._request = os.memfd_create("skillrun-launch", os.MFD_CLOEXEC)
        try:
            self.proc = subprocess.Popen(
                [bash, "-c", LAUNCHER_SCRIPT.format(go=go_r, request=self._request)],
                pass_fds=[go_r, self._request, *self.start.child_fds()],
                env={"PATH": "/usr/bin:/bin"}, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, process_group=0,
            )
        except BaseException:
            self._close_request()
            self.start.close()
            raise
        finally:
            os.close(go_r)
        self.fds = self.start.child_fds()
        """The numbers the sandbox's ends have in the launcher (closed here)."""
        self.start.sent()
        try:
            cgroup.add(self.proc.pid)
        except BaseException:
            self.discard()
            raise

    def launch(self, argv: list[str], cwd: str) -> None:
        """Become ``argv`` in ``cwd``: the request written at the file's start (``pwrite``: the launcher's copy of
        the file shares its offset, which stays at 0), then the byte that lets the launcher read it."""
        request = b"".join(part.encode() + b"\0" for part in [cwd, *argv])
        try:
            written = 0
            while written < len(request):
                written += os.pwrite(self._request, request[written:], written)
            os.write(self._go, b"x")
        finally:
            self._close_request()

    def _close_request(self) -> None:
        for fd in (self._go, self._request):
            if fd >= 0:
                os.close(fd)
        self._go = self._request = -1

    def discard(self) -> None:
        """Kill an unused launcher and let go of what it holds (its group is the caller's); once, however often
        called (its pid may be another's once it is reaped)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            pipe.close()
        self._close_request()
        self.start.close()


class LauncherPool:
    """Launchers waiting in run groups of their own (made by ``groups``' tree), for runs starting a sandbox."""

    def __init__(self, bash: str, groups: CgroupPool) -> None:
        self._bash = bash
        self._groups = groups
        self._waiting: list[Launcher] = []
        self._closed = False
        self._lock = threading.Lock()

    @property
    def waiting(self) -> list[Launcher]:
        with self._lock:
            return list(self._waiting)

    def take(self, limits: CgroupLimits) -> Launcher | None:
        """A waiting launcher, its group held to ``limits`` (the caller's from now on: ``refill`` makes the next),
        or ``None``."""
        with self._lock:
            launcher = self._waiting.pop() if self._waiting else None
        if launcher is None:
            return None
        try:
            if launcher.proc.poll() is not None:  # killed meanwhile
                raise CgroupError("the launcher has ended")
            launcher.cgroup.set_limits(limits)
        except CgroupError:
            launcher.discard()
            launcher.cgroup.remove()
            return None
        launcher.cgroup.begin()
        return launcher

    def refill(self) -> None:
        """Have ``SPARE_LAUNCHERS`` launchers wait (blocks: a thread's)."""
        while True:
            with self._lock:
                if len(self._waiting) >= SPARE_LAUNCHERS or self._closed:
                    return
            group = self._groups.tree.new_group()
            try:
                launcher = Launcher(self._bash, group)
            except (OSError, CgroupError):
                group.remove()
                return
            with self._lock:
                if not self._closed:
                    self._waiting.append(launcher)
                    continue
            launcher.discard()
            group.remove()
            return

    def close(self) -> None:
        """End the waiting launchers and remove their groups; none is made after (blocks: a thread's)."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, []
        for launcher in waiting:
            launcher.discard()
            launcher.cgroup.remove()
