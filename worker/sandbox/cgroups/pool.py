"""Run groups kept between runs: each for one owner (a workspace), and a few spare ones for new owners.

Making and removing a memory control group costs the kernel about a millisecond of work, which lands on the runs of
the moment; a group kept empty between two runs of its workspace costs nothing. A group serves its owner's runs
only, so nothing a run left charged to it (page cache of its files) counts against another tenant.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from worker.sandbox.cgroups.groups import CgroupTree, RunCgroup

MAX_IDLE_GROUPS = 128
"""Run groups kept between runs (``CgroupPool``), at most."""
GONE_REMEMBERED = 1024
"""Owners whose workspace went (``CgroupPool.drop``) remembered, the latest, so that a group of theirs handed back
later is removed, not kept: a one-off run's group is handed back once its processes are gone, which can be after
its workspace was removed."""
IDLE_PER_OWNER = 2
SPARE_GROUPS = 2


class CgroupPool:
    """Run groups of ``tree`` kept between runs (see the module's description); at most ``MAX_IDLE_GROUPS`` are
    kept (the least recently used owners' go first)."""

    def __init__(self, tree: CgroupTree) -> None:
        self.tree = tree
        self._idle: OrderedDict[str, list[RunCgroup]] = OrderedDict()
        self._spare: list[RunCgroup] = []
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, owner: str) -> RunCgroup:
        """A group for a run of ``owner``: one it used before, a spare, or a new one."""
        with self._lock:
            self._gone.pop(owner, None)  # a workspace made again under the id of one that went
            kept = self._idle.get(owner)
            group = kept.pop() if kept else (self._spare.pop() if self._spare else None)
            if kept == []:
                del self._idle[owner]
        group = group or self.tree.new_group()
        group.begin()
        return group

    def give_back(self, owner: str, group: RunCgroup) -> None:
        """Keep ``group`` for ``owner``'s next run once its processes are gone, or remove it (blocks: a thread's)."""
        for extra in self.keep(owner, group) if group.wait_empty() else [group]:
            extra.remove()

    def keep(self, owner: str, group: RunCgroup) -> list[RunCgroup]:
        """Keep the empty ``group`` for ``owner``'s next run, at once; the groups left over, for the caller to
        remove."""
        with self._lock:
            if owner in self._gone:  # its workspace went meanwhile: nothing of it runs again
                return [group]
            kept = self._idle.setdefault(owner, [])
            self._idle.move_to_end(owner)
            if len(kept) >= IDLE_PER_OWNER:
                return [group]
            kept.append(group)
            return self._evict()

    @property
    def short(self) -> bool:
        """Whether fewer spare groups than wanted are ready (``refill`` makes them)."""
        return len(self._spare) < SPARE_GROUPS

    def refill(self) -> None:
        """Make the spare groups new owners take (blocks: a thread's)."""
        while True:
            with self._lock:
                if len(self._spare) >= SPARE_GROUPS:
                    return
            group = self.tree.new_group()
            with self._lock:
                self._spare.append(group)

    def drop(self, owner: str) -> None:
        """Remove the groups kept for ``owner`` (its workspace is gone), and those handed back for it later."""
        with self._lock:
            groups = self._idle.pop(owner, [])
            self._gone[owner] = None
            while len(self._gone) > GONE_REMEMBERED:
                self._gone.popitem(last=False)
        for group in groups:
            group.remove()

    def close(self) -> None:
        """Remove every kept group."""
        with self._lock:
            groups = [g for kept in self._idle.values() for g in kept] + self._spare
            self._idle.clear()
            self._spare = []
        for group in groups:
            group.remove()
        self.tree.close()

    def _evict(self) -> list[RunCgroup]:
        evicted: list[RunCgroup] = []
        while sum(len(kept) for kept in self._idle.values()) > MAX_IDLE_GROUPS:
            evicted += self._idle.popitem(last=False)[1]
        return evicted


__all__ = ["CgroupPool"]
