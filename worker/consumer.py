"""The queue consumer behind ``skillrun worker`` (also ``python -m worker``): consume runs from Redis, execute them.

Each worker process is an RQ ``SimpleWorker`` (jobs run in the worker process itself, so workspace spawners and
caches survive between jobs) listening on ``skillrun:<runtime>``. ``--concurrency N`` starts N such processes;
add processes or machines (``docker compose up --scale worker=N``) to scale out.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys

import redis
from rq import SimpleWorker
from rq.serializers import JSONSerializer

from worker.config import get_worker_settings

QUEUE_PREFIX = "skillrun"


def queue_name(runtime: str) -> str:
    return f"{QUEUE_PREFIX}:{runtime}"


def serve_worker(args: argparse.Namespace) -> int:
    url = args.redis_url or get_worker_settings().redis_url
    if not url:
        print("skillrun worker: error: no Redis: set SKILLRUN_REDIS_URL or pass --redis-url", file=sys.stderr)
        return 2
    if args.concurrency < 1:
        print("skillrun worker: error: --concurrency must be at least 1", file=sys.stderr)
        return 2
    children = [
        subprocess.Popen([sys.executable, "-m", "worker", "--runtime", args.runtime, "--concurrency", "1",
                          "--redis-url", url, *(["--burst"] if args.burst else [])])
        for _ in range(args.concurrency - 1)
    ]

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            child.send_signal(signum)
        raise SystemExit(128 + signum)

    if children:
        signal.signal(signal.SIGTERM, forward)
    try:
        connection = redis.Redis.from_url(url)
        worker = SimpleWorker(
            [queue_name(args.runtime)], connection=connection, serializer=JSONSerializer,
            name=f"{socket.gethostname()}-{os.getpid()}",
        )
        worker.work(burst=args.burst, logging_level="WARNING")
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
        codes = [child.wait() for child in children]
    return 0 if all(c == 0 for c in codes) else 1
