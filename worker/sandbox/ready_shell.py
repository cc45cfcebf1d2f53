"""Ready shells: a bash started ahead of its command, so a warm run skips the spawner's round trip, bash's start-up
and, in a sandbox, the sandbox's.

After a run, the workspace's spawner (``worker.sandbox.spawner``) starts bash for the workspace's next run ahead of time
(in the workspace's held sandbox, ``worker.sandbox.held``, where the caller places it in a control group of its
own while it waits: ``ReadyShell.place``); the next run that fits hands it its script (``ReadyShell.start``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shlex
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from worker.sandbox.cgroups.groups import RunCgroup
from worker.errors import CgroupError, SpawnerError
from worker.sandbox.fdwait import wait_readable
from worker.sandbox.bubblewrap import SandboxSpec

if TYPE_CHECKING:
    from worker.sandbox.spawner import Spawned

READY_TIMEOUT_SECONDS = 5.0
READY_SHELL_VARIABLE = "__skillrun_command"
READY_SHELL_LOADER = (
    f'exec 4>&-; unset {READY_SHELL_VARIABLE}; source /proc/self/fd/3 && eval "${READY_SHELL_VARIABLE}"'
)
"""What a ready shell runs: say it has started (close descriptor 4), forget any variable of that name its
environment brought, read its script (one short file: the run's variables and the command in a variable), then
run the command at top level. A shell given up reads an empty script and runs nothing."""
RUN_VARIABLES = frozenset({"RUN_DIR", "HOME", "TMPDIR"})
"""The variables that differ from one run of a workspace to the next (a ready shell gets them with its script)."""


class ReadyShell:
    """A bash started ahead of its command, so a warm run skips the spawner's round trip and bash's start-up.

    It was started as the workspace user in a process group of its own, with the environment and folder of the
    workspace's last run, reading its descriptor 3. ``start`` writes one short script there, in one atomic pipe
    write: it exports the run's own ``RUN_DIR``, ``HOME`` and ``TMPDIR``, resets ``SECONDS`` and holds the command
    in a shell variable, which the shell then runs with ``eval`` at top level (where line numbers, ``return`` and
    error messages behave as under ``bash -c``). A shell that is not used is discarded: its pipe closes, it reads
    nothing, runs nothing and exits.

    A shell in a held sandbox takes no run until ``place`` has put it in its control group (``cgroup``), which it
    keeps for its run (it waits for its script until then, running nothing of a run); ``on_release`` is called
    once the host has let go of the shell (to hand that group back)."""

    def __init__(
        self, spawned: Spawned, env: dict[str, str], cwd: str, out_fd: int, err_fd: int, script_fd: int, up_fd: int,
        *, folder: tuple[int, int] | None, sandbox: SandboxSpec | None = None,
    ) -> None:
        self.spawned = spawned
        self.env = env
        self.cwd = cwd
        self.folder = folder  # what ``cwd`` was (``folder_identity``) before the shell was asked for
        self.out_fd = out_fd
        self.err_fd = err_fd
        self._script = script_fd
        os.set_blocking(up_fd, False)
        self._up = up_fd
        self.sandbox = sandbox
        self.cgroup: RunCgroup | None = None
        self.on_release: Callable[["ReadyShell"], None] | None = None
        self.placement: asyncio.Task | None = None  # the caller's task running ``place``
        self._placing = False
        self._placed = False
        self._discarded = False

    @property
    def placed(self) -> bool:
        """Whether the shell can take a run: it needs no placing, or it was placed."""
        return self.sandbox is None or (self._placed and not self._discarded)

    async def place(self, cgroup: RunCgroup) -> bool:
        """Put the held sandbox's shell in ``cgroup`` (its command, and all it starts, are born there); ``False`` if
        that failed (it is then discarded). A shell discarded meanwhile is let go here."""
        if self.sandbox is None or self._placing or self._discarded:
            return False
        self._placing = True
        placed = False
        try:
            # A move into a v1 memory group waits for an RCU grace period (milliseconds): not on the event loop.
            await asyncio.to_thread(cgroup.add, await self.spawned.started())
            placed = True
        except (CgroupError, SpawnerError, OSError):
            placed = False
        finally:
            self._placing = False
        if placed:
            self.cgroup = cgroup
            self._placed = True
        if not placed or self._discarded:
            self._kill()
            self.discard()
        return placed and not self._discarded

    def _kill(self) -> None:
        """Kill the shell of a held sandbox that will not take a run: one not placed must not run outside its group,
        and a process of a later run (the same user, in the same namespace) could ptrace a placed one."""
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
            and folder_identity(cwd) == self.folder
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
        """Give the shell up: it reads an empty script and exits (in a held sandbox it is killed). While it is being
        placed, ``place`` finishes this."""
        self._discarded = True
        if self._placing:
            return
        if self.sandbox is not None:
            self._kill()
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
        callback, self.on_release = self.on_release, None
        if callback is not None:
            callback(self)


def folder_identity(path: str) -> tuple[int, int] | None:
    """The device and inode of the folder at ``path`` (``None`` if there is none). Taken before a shell is asked
    for in it: a folder put in its place later (a skill restaged while the spawner changes into it) then differs,
    and the shell is not used."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino
