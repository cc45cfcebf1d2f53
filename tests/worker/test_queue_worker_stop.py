"""A queue worker stops when told, whenever it is told: its command channel's reader never holds the stop."""

from __future__ import annotations

import threading

import redis
from rq import Queue

from worker.jobs.queue_worker import RunWorker


def test_a_worker_between_subscriptions_of_its_command_channel_stops_at_once(redis_url):
    """The reader waits for a subscription at most its poll; RQ's own (60 s), which redis-py's stop joins, held a
    worker stopped right after it started (before its subscription was confirmed) for up to a minute."""
    connection = redis.Redis.from_url(redis_url)
    worker = RunWorker([Queue("stop-test", connection=connection)], connection=connection)
    worker.subscribe()
    worker.pubsub.unsubscribe()  # the reader is now waiting for a subscription, as at a worker's very start
    stopping = threading.Thread(target=worker.unsubscribe, daemon=True)
    stopping.start()
    stopping.join(30)
    assert not stopping.is_alive(), "the worker's stop waited for its command channel's reader"
    assert not worker.pubsub_thread.is_alive()
    connection.close()
