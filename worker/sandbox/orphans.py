"""Adopting what a sandbox's bwrap monitor leaves behind: its init, when the monitor ends first.

While one of its sandboxes may leave one (``ORPHANS``: from before its start until its monitor and init are
reaped), the process that starts sandboxes is a child subreaper, so such an init becomes its child rather than the
host init's (which reaps late, or never), and is reaped here: by its pidfd once its monitor is (``reap_adopted``),
and, for an init that ended after that was last asked (a run cancelled or timed out meanwhile), by the sweep each
sandbox's end makes (``reap_ended_inits``). Only while one is held: a subreaper for good would also adopt the
orphans of every other program the process runs (a browser leaves four a launch).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator

from worker.errors import RuntimeUnavailableError

PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


class OrphanAdoption:
    """This process is a child subreaper (``PR_SET_CHILD_SUBREAPER``) while it is held: a descendant whose parent
    ends first — a sandbox's init whose bwrap monitor exited before it — becomes this process's child, to be reaped
    here (``reap_adopted``), instead of the host init's. Each sandbox that may leave an orphan holds it from before
    its start until its monitor and init are reaped (``hold``, ``let_go``, from any thread); the last to let go
    ends it. Processes inside a sandbox are adopted by its own init, never by this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0

    def hold(self) -> None:
        with self._lock:
            if not self._holders:
                _subreaper(True)
            self._holders += 1

    def let_go(self) -> None:
        with self._lock:
            self._holders -= 1
            if not self._holders:
                _subreaper(False)
            reap_ended_inits()  # ~0.1 ms: a sandbox of its own costs tens (a held sandbox's runs take no hold)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.hold()
        try:
            yield
        finally:
            self.let_go()


def _subreaper(on: bool) -> None:
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise RuntimeUnavailableError(
            f"cannot make this process a child subreaper: {os.strerror(ctypes.get_errno())} (Linux 3.4 or later)")


ORPHANS = OrphanAdoption()
"""This process's adoption of its sandboxes' orphans."""


def reap_adopted(pidfd: int, *, block: bool) -> bool:
    """Reap the process ``pidfd`` refers to if it is this process's child: a sandbox's init (or a held sandbox's
    pid 1) adopted when its bwrap monitor ended first (``ORPHANS``). Ask once that monitor has been reaped: from
    then on its orphans are this process's. Whether nothing is left to wait for — reaped here, or never this
    process's to reap (its monitor reaped it); ``False`` while it still runs and ``block`` is not set."""
    try:
        return os.waitid(os.P_PIDFD, pidfd, os.WEXITED | (0 if block else os.WNOHANG)) is not None
    except ChildProcessError:
        return True


def reap_ended_inits() -> int:
    """Reap this process's children that ended as the init of a PID namespace of their own: sandboxes' inits it
    adopted (``ORPHANS``) whose reaping was not waited for (they ended after ``reap_adopted`` last asked: a run
    cancelled or timed out meanwhile). Only such children: any other is someone's to wait for (asyncio's, a
    ``subprocess``'s). How many were reaped. Each sandbox's end sweeps (``OrphanAdoption.let_go``)."""
    reaped = 0
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/children") as listing:
                children = listing.read().split()
        except OSError:
            continue
        for child in map(int, children):
            if _ended_namespace_init(child):
                with contextlib.suppress(ChildProcessError):
                    reaped += bool(os.waitpid(child, os.WNOHANG)[0])
    return reaped


def _ended_namespace_init(pid: int) -> bool:
    """Whether ``pid`` is a zombie that was pid 1 of a PID namespace below this process's."""
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except OSError:
        return False
    return fields.get("State", "").strip().startswith("Z") and fields.get("NSpid", "").split()[-1:] == ["1"] and \
        len(fields.get("NSpid", "").split()) > 1


__all__ = ["ORPHANS", "OrphanAdoption", "reap_adopted", "reap_ended_inits"]
