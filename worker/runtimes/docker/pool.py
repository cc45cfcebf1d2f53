"""The Docker runtime's warm pool: containers made ahead, so the first run of a new workspace does not wait for
``docker run``.

A warm container is an ordinary workspace container (hardened, its executor listening as the workspace's user)
made for a *reserved* folder — an empty folder of the work root with its own user id
(``WorkspaceManager.reserve``) — before any workspace has taken it. A new workspace whose first run fits a warm
container takes it: the workspace is laid out in that folder (``acquire(..., reserved=)``), and the container,
found by the folder's name like any other, is the workspace's from then on. A warm container is made for one
*template* — its image and the library roots it mounts — and taken only by a workspace whose first run needs
exactly that, so it never shows a workspace a library its runs do not use. The pool fills for one template: the
first asked for, until another is asked for twice with no hit of its own between (so new workspaces of many
libraries do not make it churn), making room by dropping the oldest of others. Until it is taken nothing runs in
a warm container but its executor, and its folder is empty; it serves one workspace and goes with it.

The pool holds at most ``size`` containers (a container holds its executor, ~10 MB, and the engine's share), is
refilled in the background after each take, and renews what it holds once it is ``max_age`` old (half the idle
time, so other workers' idle reapers, which remove a gone worker's warm containers older than the idle time, leave
a live pool's alone). A container's age counts from before it was made, as the engine's creation time does; a
replacement is made before the container it replaces is removed (the pool holds one more meanwhile), so a live
pool is never seen empty. It drops containers whose executor ended (an engine restart: the pool is filled again),
makes no more for an image that cannot run the executor, and removes what it holds at ``close`` (a container being
made is finished first, then removed). ``size`` 0 turns it off.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from worker.errors import RuntimeUnavailableError
from worker.runtimes.docker.boxes import Box, Boxes
from worker.workspaces.manager import Workspace, WorkspaceManager

Template = tuple[str, tuple[str, ...]]
"""What a warm container is made for: its image and the library roots it mounts (read-only)."""
SWITCH_AFTER = 2
"""Asks for another template, with no hit of the pool's own between, that make it the pool's template."""
MAX_REMEMBERED_TEMPLATES = 64
RENEWAL_MARGIN = 0.05
"""Seconds past ``max_age`` the renewal looks, so what it looks for is past its age."""


@dataclass
class Warm:
    """A warm container and the reserved folder it was made for."""

    template: Template
    folder: Workspace
    box: Box
    made: float
    """When its make began (``time.monotonic``): its age counts from there, as the engine's creation time does."""


class WarmPool:
    """Warm containers of one runtime (see the module's description). ``take`` may be called from any thread;
    the pool refills itself on the event loop it was made on, making each container in a thread."""

    def __init__(self, size: int, boxes: Boxes, workspaces: WorkspaceManager, run_limits: Callable[[], tuple[int, int]],
                 *, max_age: float) -> None:
        self.size = size
        self.boxes = boxes
        self.workspaces = workspaces
        self.run_limits = run_limits
        self.max_age = max_age
        self._lock = threading.Lock()  # guards what follows: runs' threads take, the loop fills
        self._warm: list[Warm] = []
        self._template: Template | None = None
        self._misses: dict[Template, int] = {}  # other templates asked for since the pool's last hit
        self._barren: set[Template] = set()  # templates whose containers have no executor: none is made warm
        self._loop: asyncio.AbstractEventLoop | None = None
        self._filling: asyncio.Task | None = None
        self._renewal: asyncio.TimerHandle | None = None
        self._closed = False
        self.problem = ""  # why the last fill failed, if it did

    def take(self, template: Template) -> Warm | None:
        """A warm container made for ``template`` (younger than ``max_age``, its executor answering), if the pool
        has one (call ``discard`` with it if it cannot be used). A template the pool does not fill for becomes
        its template once asked for ``SWITCH_AFTER`` times without a hit meanwhile, so new workspaces of many
        libraries do not make it churn."""
        stale, taken = [], None
        now = time.monotonic()
        with self._lock:
            if template in self._barren:
                return None
            if self._template is None or template == self._template:
                self._template, self._misses = template, {}
            else:
                self._misses[template] = self._misses.get(template, 0) + 1
                if self._misses[template] >= SWITCH_AFTER:
                    self._template, self._misses = template, {}
                elif len(self._misses) > MAX_REMEMBERED_TEMPLATES:
                    self._misses = {template: self._misses[template]}
            keep = []
            for warm in self._warm:
                good = now - warm.made <= self.max_age and warm.box.link is not None and warm.box.link.usable()
                if warm.template != template or (good and taken is not None):
                    keep.append(warm)
                elif good:
                    taken = warm
                else:
                    stale.append(warm)  # past its age, or its container ended (an engine restart)
            self._warm = keep
        for warm in stale:
            self.discard(warm)
        self._kick()
        return taken

    def holds(self, folder: str) -> bool:
        """Whether ``folder`` is a warm container's, not taken yet (the idle reaper leaves it)."""
        with self._lock:
            return any(warm.folder.path.name == folder for warm in self._warm)

    def discard(self, warm: Warm) -> None:
        """Remove a warm container and give its reserved folder back (blocking)."""
        with contextlib.suppress(RuntimeUnavailableError):
            self.boxes.remove((warm.folder.path.name, warm.template[0]))
        self.workspaces.release(warm.folder)

    def start(self, loop: asyncio.AbstractEventLoop, template: Template | None = None) -> None:
        """Refill on ``loop`` from now on (the runtime's ``start`` or first run tells it its loop); with
        ``template``, fill for it now unless the pool has a template already."""
        self._loop = loop
        if template is not None:
            with self._lock:
                if self._template is None:
                    self._template, self._misses = template, {}
            self._kick()

    def _kick(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._fill_soon)

    def _fill_soon(self) -> None:
        if not self._closed and (self._filling is None or self._filling.done()):
            self._filling = asyncio.get_running_loop().create_task(self._fill())

    async def _fill(self) -> None:
        """Make warm containers until the pool holds ``size`` of its template younger than ``max_age``. Those past
        ``max_age`` of other templates go first, and then, for room, the oldest of other templates; one past
        ``max_age`` of its template goes once its replacement is made. Look again when the oldest comes of age (so
        what the pool holds stays younger than the idle time other workers' reapers go by)."""
        aged: list[Warm] = []
        while not self._closed:
            now = time.monotonic()
            with self._lock:
                template = self._template
                aged = [warm for warm in self._warm if now - warm.made > self.max_age]
                others = [warm for warm in self._warm if warm not in aged and warm.template != template]
                missing = self.size - sum(1 for warm in self._warm if warm not in aged and warm.template == template)
                crowded = len(self._warm) - len(aged) + min(missing, 1) - self.size
                drop = [warm for warm in aged if warm.template != template] + others[: max(crowded, 0)]
                self._warm = [warm for warm in self._warm if warm not in drop]
            for warm in drop:
                await asyncio.to_thread(self.discard, warm)
            if template is None or missing <= 0 or template in self._barren:
                break
            made = asyncio.ensure_future(asyncio.to_thread(self._make, template))
            try:
                warm = await asyncio.shield(made)
            except asyncio.CancelledError:  # what the thread finishes is removed, not left behind
                made.add_done_callback(self._discard_made)
                raise
            except Exception as exc:  # noqa: BLE001 - a pool that cannot fill leaves runs to make their own
                self.problem = str(exc)
                break
            self.problem = ""
            if warm.box.link is None:  # the image cannot run the executor: a warm container could not be used
                self._barren.add(template)
                await asyncio.to_thread(self.discard, warm)
                break
            with self._lock:
                if self._closed:
                    gone = [warm]
                else:  # the new one takes the place of one past its age, if there is one still
                    gone = [old for old in self._warm if old in aged and old.template == template][:1]
                    self._warm = [old for old in self._warm if old not in gone] + [warm]
            for old in gone:
                await asyncio.to_thread(self.discard, old)
        with self._lock:  # past its age and not replaced (the fill stopped, or the template changed): it goes
            left = [warm for warm in self._warm if warm in aged]
            self._warm = [warm for warm in self._warm if warm not in left]
        for warm in left:
            await asyncio.to_thread(self.discard, warm)
        self._renew_later()

    def _renew_later(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
        with self._lock:
            oldest = min((warm.made for warm in self._warm), default=None)
        if oldest is not None and not self._closed:
            delay = max(oldest + self.max_age - time.monotonic(), 0) + RENEWAL_MARGIN
            self._renewal = asyncio.get_running_loop().call_later(delay, self._fill_soon)

    def _discard_made(self, made: asyncio.Future) -> None:
        if not made.cancelled() and made.exception() is None:
            asyncio.get_running_loop().run_in_executor(None, self.discard, made.result())

    def _make(self, template: Template) -> Warm:
        image, roots = template
        started = time.monotonic()
        folder = self.workspaces.reserve()
        try:
            mounts = {root: _inode(root) for root in roots}
            box = self.boxes.make_warm(folder, image, mounts, self.run_limits())
        except BaseException:
            self.workspaces.release(folder)
            raise
        return Warm(template, folder, box, started)

    async def wait_filled(self) -> None:
        """Wait until the pool's refill (if any) is done."""
        await asyncio.sleep(0)
        while self._filling is not None and not self._filling.done():
            await asyncio.shield(self._filling)

    async def close(self) -> None:
        """Stop refilling (a container being made is finished, then removed with the rest) and remove every warm
        container not taken."""
        self._closed = True
        if self._renewal is not None:
            self._renewal.cancel()
        if self._filling is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._filling)
        with self._lock:
            warm, self._warm, self._template = self._warm, [], None
        for item in warm:
            await asyncio.to_thread(self.discard, item)


def _inode(folder: str) -> int:
    return os.stat(folder).st_ino


__all__ = ["Template", "Warm", "WarmPool"]
