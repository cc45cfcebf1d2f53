"""What a run's own sandbox leaves on the host once it ended: nothing, not even a zombie.

bwrap's monitor exits as soon as its init has said how the command ended, often before the init itself has ended;
the init was then left to the host's init, which on many hosts (a container's, a VM's agent) reaps late or never.
Each such zombie held a pid of the host, and a place of its run group's ``pids.max``, which the workspace's next
run in that group went without. The worker now adopts them (a child subreaper while a sandbox of its own may leave
one: ``worker.sandbox.orphans.ORPHANS``) and reaps them. As root, for real.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
import threading
import time

import pytest

from worker.contract import RunLimits
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.sandbox.orphans import ORPHANS, _ended_namespace_init

pytestmark = pytest.mark.root

FRESH_WORKSPACES = 24
BURST = 6
"""First runs started at once: more than the launchers kept waiting, so some sandboxes start without one."""
SAMPLE_SECONDS = 0.002
SETTLE_SECONDS = 2.0
"""How long the last zombies may take to be reaped once the runs have ended (a guard, not a measure)."""
EXACT_PROCESSES = 4
"""A sandbox of its own's init, bash, and the two sides of ``echo | cat``: a run that needs its whole limit."""


def bwrap_zombies() -> dict[int, tuple[int, int]]:
    """The host's zombie processes named ``bwrap`` (a sandbox's init is a fork of bwrap): pid → (parent, user)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                stat = stat_file.read()
            uid = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        name, _, rest = stat.partition("(")[2].rpartition(")")
        fields = rest.split()
        if name == "bwrap" and fields and fields[0] == "Z":
            found[int(entry)] = (int(fields[1]), uid)
    return found


class ZombieWatch:
    """Looks at the host's bwrap zombies every ``SAMPLE_SECONDS`` in a thread, keeping each one it saw."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._look, daemon=True)

    def __enter__(self) -> "ZombieWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _look(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.seen.update(bwrap_zombies())


async def test_first_runs_of_fresh_workspaces_leave_no_zombie_to_the_hosts_init(work_root, make_request):
    uids: set[int] = set()
    async with LocalWorkspaceRuntime(work_root) as runtime:

        async def first_run(name: str) -> None:
            result = await runtime.run(make_request("echo hi | cat", workspace_id=name, keep_workspace=False))
            assert (result.exit_code, result.stdout) == (0, "hi\n"), result.stderr
            uids.add(runtime.workspaces.find(name).uid)
            await runtime.end_workspace(name)

        with ZombieWatch() as watch:
            for n in range(FRESH_WORKSPACES):
                await first_run(f"fresh-{n}")
            await asyncio.gather(*(first_run(f"burst-{n}") for n in range(BURST)))
            await runtime.idle()
            deadline = time.monotonic() + SETTLE_SECONDS
            while (left := [pid for pid, (_, uid) in bwrap_zombies().items() if uid in uids]) and \
                    time.monotonic() < deadline:
                await asyncio.sleep(0.05)
    theirs = {pid: parent for pid, (parent, uid) in watch.seen.items() if uid in uids}
    orphaned = sorted(pid for pid, parent in theirs.items() if parent == 1)
    assert not orphaned, f"{len(orphaned)} of {len(theirs)} sandbox inits were left to the host's init as zombies"
    assert not left, f"sandbox inits still zombies after the runs: {left}"


async def test_a_workspaces_runs_get_their_whole_process_limit_run_after_run(work_root, make_request, monkeypatch):
    async with LocalWorkspaceRuntime(work_root, spawners="off") as runtime:
        await runtime.run(make_request("true", workspace_id="exact"))  # sets up the run groups and launchers
        # Every sandbox starts without a launcher, in a group kept for its workspace, as when a burst of runs has
        # taken the launchers waiting: each run's group held the last ones' zombies.
        monkeypatch.setattr(runtime.groups, "take_launcher", lambda limits: None)
        for _ in range(8):
            result = await runtime.run(make_request("echo hi | cat", workspace_id="exact",
                                                    limits=RunLimits(processes=EXACT_PROCESSES)))
            await runtime.idle()
            assert (result.exit_code, result.stdout) == (0, "hi\n"), result.stderr
            assert "fork" not in result.stderr, f"a zombie of an earlier run took a place of the limit: {result.stderr}"


async def test_once_its_sandboxes_are_reaped_the_worker_adopts_no_other_programs_orphans(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root) as runtime:
        for n in range(3):
            result = await runtime.run(make_request("true", workspace_id=f"quiet-{n}", keep_workspace=False))
            assert result.exit_code == 0, result.stderr
        await runtime.idle()
        subprocess.run(["bash", "-c", "sleep 0.1 &"], check=True)  # another program's orphan, as a browser leaves
        time.sleep(0.5)
    adopted = zombie_children()
    assert not adopted, f"the worker adopted another program's orphans and left them zombies: {adopted}"


def zombie_children() -> dict[int, str]:
    """This process's children that have ended and are not reaped: pid → name."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue
        name, _, rest = stat.partition("(")[2].rpartition(")")
        fields = rest.split()
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            found[int(entry)] = name
    return found


CLONE_NEWPID = 0x20000000


def test_an_adopted_init_that_ended_after_its_reaping_was_asked_for_is_swept_by_a_later_sandboxs_end():
    """A sandbox's init adopted while this process was a subreaper, that ends after ``reap_adopted`` last asked (a
    run cancelled or timed out meanwhile), would stay a zombie of the worker for ever (the full suite once found
    one): the next sandbox's end sweeps such children, and only them."""
    libc = ctypes.CDLL(None, use_errno=True)
    other = subprocess.Popen(["true"])  # someone else's child of this process: never reaped by the sweep
    other_pid = other.pid
    with ORPHANS.held():
        middle = os.fork()
        if middle == 0:  # the monitor: into a PID namespace, fork its init, and end before it
            if libc.unshare(CLONE_NEWPID) != 0 or os.fork() == 0:
                time.sleep(0.3)
                os._exit(0)
            os._exit(0)
        os.waitpid(middle, 0)
        time.sleep(0.8)  # the init ends, adopted, and nobody asks for it
    assert _zombie_inits() == [], "the sweep left an ended init"  # let_go swept it
    other.wait(timeout=10)  # still this process's to wait for
    assert other.returncode == 0 and other_pid not in zombie_children()


def _zombie_inits() -> list[int]:
    return [pid for pid in zombie_children() if _ended_namespace_init(pid)]
