"""Waiting on the event loop for a file descriptor to become readable (no thread, no polling)."""

from __future__ import annotations

import asyncio
import select


def readable_now(fd: int) -> bool:
    """Whether ``fd`` can be read at once (it is not waited for)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


async def wait_readable(fd: int, timeout: float) -> bool:
    """Wait on the running loop until ``fd`` can be read; ``False`` after ``timeout``."""
    if timeout <= 0:
        return False
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(True))
    timer = loop.call_later(timeout, lambda: ready.done() or ready.set_result(False))
    try:
        return await ready
    finally:
        timer.cancel()
        loop.remove_reader(fd)
