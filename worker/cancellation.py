"""Cancellation: how a run in progress is told to stop, from whichever thread asks."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable


class Cancellation:
    """A run's stop flag, made on the event loop that runs the run.

    ``set`` may be called from any thread (a worker's heartbeat thread sees a cancel request in the run store);
    the loop then wakes ``wait`` and calls the callbacks registered with ``on_set``. ``is_set`` may be read from
    any thread, so a runtime that follows its command in a worker thread polls it.
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._flag = threading.Event()
        self._event = asyncio.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._fired = False

    def set(self) -> None:
        if self._flag.is_set():
            return
        self._flag.set()
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing on it is waiting any more
            self._loop.call_soon_threadsafe(self._fire)

    def is_set(self) -> bool:
        return self._flag.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    def on_set(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the loop once the flag is set (soon, if it is set already). Loop thread only."""
        if self._fired:
            self._loop.call_soon(callback)
        else:
            self._callbacks.append(callback)

    def remove(self, callback: Callable[[], None]) -> None:
        """Take back a callback given to ``on_set`` that has not been called."""
        with contextlib.suppress(ValueError):
            self._callbacks.remove(callback)

    def _fire(self) -> None:
        self._fired = True
        self._event.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
