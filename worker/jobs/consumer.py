"""The queue consumer behind ``skillrun worker`` (also ``python -m worker``): consume runs from Redis, execute them.

Each worker process is an RQ ``SimpleWorker`` (jobs run in the worker process itself, so workspace spawners and
caches survive between jobs; ``worker.jobs.queue_worker.RunWorker``, writing RQ's bookkeeping once per job) listening on
``skillrun:<runtime>`` and on its node's queue (``worker.jobs.nodes``: the workers of one work root; the runs of the kept
workspaces that live there), and beating for its node.
``--concurrency N`` starts N such processes; add processes or machines (``docker compose up --scale worker=N``) to
scale out.

Workers of the runtimes that build skills' dependency environments on their host (local, docker) also take the jobs
that prepare a new library version's environments for their runtime (``skillrun:<runtime>:environments``,
``worker.jobs.execute.prepare_environments``), after the runs waiting on their own queue. Every worker takes the removals
of its runtime's kept workspaces (``skillrun:<runtime>:workspaces``, ``worker.jobs.execute.remove_kept_workspace``) before
its runs: one team's queued runs never hold back another's removal.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys

import redis
from rq.serializers import JSONSerializer

from worker.config import get_worker_settings
from worker.contract import RuntimeName
from worker.jobs.nodes import NodeBeat, node_queue_name
from worker.jobs.queue_worker import RunWorker

QUEUE_PREFIX = "skillrun"
BUILDING_RUNTIMES = (RuntimeName.LOCAL.value, RuntimeName.DOCKER.value)
"""The runtimes whose workers build dependency environments ahead of runs (a Cube sandbox installs its own)."""


def queue_name(runtime: str) -> str:
    return f"{QUEUE_PREFIX}:{runtime}"


def environments_queue_name(runtime: str) -> str:
    """The queue of jobs preparing environments for ``runtime`` (its workers take them when no run waits)."""
    return f"{QUEUE_PREFIX}:{runtime}:environments"


def workspaces_queue_name(runtime: str) -> str:
    """The queue of jobs removing ``runtime``'s kept workspaces."""
    return f"{QUEUE_PREFIX}:{runtime}:workspaces"


def consumed_queues(runtime: str, node: str) -> list[str]:
    """The queues a worker of ``runtime`` on ``node`` takes jobs from, in order: workspace removals (quick, and never
    held back by another team's queued runs), its node's (the runs and removals of the kept workspaces that live
    there), the runtime's runs, then environment builds."""
    extra = [environments_queue_name(runtime)] if runtime in BUILDING_RUNTIMES else []
    return [workspaces_queue_name(runtime), node_queue_name(runtime, node), queue_name(runtime), *extra]


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
    beat = None
    try:
        connection = redis.Redis.from_url(url)
        from worker.jobs.execute import this_node  # here: importing the runtimes as the consumer loads left a sandbox unreaped

        # Unique even across containers that share a host name and number their processes alike (host network)
        node, name = this_node(), f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        beat = NodeBeat(connection, args.runtime, node, name).start()
        worker = RunWorker(consumed_queues(args.runtime, node), connection=connection, serializer=JSONSerializer,
                           name=name)
        worker.work(burst=args.burst, logging_level="WARNING")
    finally:
        if beat is not None:
            beat.stop()
        jobs = sys.modules.get("worker.jobs.execute")
        if jobs is not None:  # its runtimes let go of what they hold (a Docker runtime's warm pool, containers)
            jobs.close_runtimes()
        for child in children:
            if child.poll() is None:
                child.terminate()
        codes = [child.wait() for child in children]
    return 0 if all(c == 0 for c in codes) else 1
