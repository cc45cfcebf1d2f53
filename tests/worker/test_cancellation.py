"""Cancellation: a run's stop flag, set from any thread, acted on by the loop that runs the run."""

from __future__ import annotations

import asyncio
import threading

from worker.cancellation import Cancellation


async def test_set_from_another_thread_wakes_waiters_and_callbacks_on_the_loop():
    cancel = Cancellation()
    called_on: list[threading.Thread] = []
    cancel.on_set(lambda: called_on.append(threading.current_thread()))
    waiter = asyncio.create_task(cancel.wait())
    await asyncio.to_thread(cancel.set)
    await asyncio.wait_for(waiter, 5)
    assert cancel.is_set()
    assert called_on == [threading.main_thread()]


async def test_a_callback_registered_after_the_set_is_called_once():
    cancel = Cancellation()
    await asyncio.to_thread(cancel.set)
    await asyncio.wait_for(cancel.wait(), 5)
    calls: list[int] = []
    cancel.on_set(lambda: calls.append(1))
    cancel.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert calls == [1]


async def test_a_removed_callback_is_not_called():
    cancel = Cancellation()
    calls: list[int] = []

    def callback() -> None:
        calls.append(1)

    cancel.on_set(callback)
    cancel.remove(callback)
    cancel.set()
    await asyncio.wait_for(cancel.wait(), 5)
    assert calls == []


def test_setting_after_its_loop_has_closed_is_harmless():
    async def make() -> Cancellation:
        return Cancellation()

    cancel = asyncio.run(make())
    cancel.set()
    assert cancel.is_set()
