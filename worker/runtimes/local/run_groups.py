"""The local runtime's run groups: a control group for each sandboxed run, and launchers waiting in spare ones.

Set up when the first sandboxed run comes (``start``): the host's cgroup tree is found (``worker.sandbox.cgroups.groups``; where
there is none, the reason is kept and every result says its limits held per process only), a pool of groups is
made on it, and where the worker can drop privileges, launchers wait in groups of their own for first runs
(``worker.sandbox.launcher``). A run's group is retired once the run's processes are gone: kept for its workspace's next
run when it is empty, or emptied and handed back in the background. Closing removes every group and launcher.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from worker.sandbox.cgroups.pool import CgroupPool
from worker.sandbox.cgroups.groups import CgroupError, CgroupLimits, CgroupTree, RunCgroup
from worker.sandbox.launcher import Launcher, LauncherPool
from worker.sandbox.bubblewrap import find_bwrap
from worker.workspaces.user_ids import find_setpriv


class RunGroups:
    """What a local runtime's sandboxed runs are held to; ``in_background`` hands a blocking job to the runtime's
    housekeeping thread (``False`` once it is closed)."""

    def __init__(self, in_background: Callable[..., bool]) -> None:
        self._in_background = in_background
        self.pool: CgroupPool | str | None = None
        """The groups, or why the host has none; ``None`` before the first sandboxed run."""
        self.launchers: LauncherPool | None = None
        self._endings: set[asyncio.Future] = set()

    @property
    def available(self) -> bool:
        """Whether runs get control groups of their own."""
        return isinstance(self.pool, CgroupPool)

    async def start(self, bash: str) -> None:
        """Set up once, for the first sandboxed run: check bubblewrap, find the cgroup tree, start launchers."""
        if self.pool is not None:
            return
        await asyncio.to_thread(find_bwrap)  # checked once: installed, and able to make its namespaces
        tree = await asyncio.to_thread(CgroupTree.detect)
        self.pool = CgroupPool(tree) if isinstance(tree, CgroupTree) else tree
        if isinstance(self.pool, CgroupPool) and find_setpriv() is not None:
            self.launchers = LauncherPool(bash, self.pool)
            self._in_background(self.launchers.refill)

    def take(self, workspace_id: str) -> RunCgroup:
        """A group for a run of ``workspace_id`` (one it used before, when one is kept); only when ``available``."""
        return self.pool.take(workspace_id)

    def new_group(self, workspace_id: str, limits: CgroupLimits) -> RunCgroup | None:
        """A group for a run started now, held to ``limits``; ``None`` where there are none."""
        if not self.available:
            return None
        cgroup = self.pool.take(workspace_id)
        try:
            cgroup.set_limits(limits)
        except CgroupError:
            self.retire(workspace_id, cgroup)
            raise
        return cgroup

    def take_launcher(self, limits: CgroupLimits) -> Launcher | None:
        """A launcher waiting in a group of its own held to ``limits``, for a run starting a sandbox of its own;
        another is made in the background. ``None`` if none is ready."""
        launcher = self.launchers.take(limits) if self.launchers is not None else None
        if launcher is not None:
            self._in_background(self.launchers.refill)
        return launcher

    def retire_after(self, gone: asyncio.Future | None, workspace_id: str, cgroup: RunCgroup) -> None:
        """Retire a run's group once its processes are gone (``ProcessOutcome.gone``; a sandboxed run's result
        comes while they are still ending), or once its result is on its way."""
        if gone is None:
            asyncio.get_running_loop().call_soon(self.retire, workspace_id, cgroup)
            return
        self._endings.add(gone)
        gone.add_done_callback(self._endings.discard)
        gone.add_done_callback(lambda _: self.retire(workspace_id, cgroup))

    def retire(self, workspace_id: str, cgroup: RunCgroup) -> None:
        """Once a run's processes are gone, keep its group for the workspace's next run, or remove it; and have
        spare groups ready for new workspaces (in the background; here once the runtime is closed). A group
        already empty (``RunCgroup.empty``) is kept at once: no thread is woken as a result goes out."""
        pool = self.pool
        if not isinstance(pool, CgroupPool):
            cgroup.remove()
            return
        if cgroup.empty():
            surplus = pool.keep(workspace_id, cgroup)
        elif self._in_background(pool.give_back, workspace_id, cgroup):
            surplus = []
        else:
            surplus = [cgroup]
        for extra in surplus:
            if not self._in_background(extra.remove):
                extra.remove()
        if pool.short:
            self._in_background(pool.refill)

    @property
    def missing(self) -> str | None:
        """Why runs' limits hold per process only (the host has no run groups), if they do."""
        return self.pool if isinstance(self.pool, str) else None

    def drop(self, workspace_id: str) -> None:
        """Remove the groups kept for a workspace that is gone."""
        if isinstance(self.pool, CgroupPool):
            self.pool.drop(workspace_id)

    async def ended(self) -> None:
        """Wait until the runs that ended have let go of their groups."""
        if self._endings:
            await asyncio.gather(*self._endings, return_exceptions=True)

    async def close_launchers(self) -> None:
        """End the launchers (no run is to start a sandbox of its own any more)."""
        launchers, self.launchers = self.launchers, None
        if launchers is not None:
            await asyncio.to_thread(launchers.close)

    async def close(self) -> None:
        """Remove every group (call once the runs' groups came back); a run after this makes its groups anew."""
        if isinstance(self.pool, CgroupPool):
            pool, self.pool = self.pool, None
            await asyncio.to_thread(pool.close)
