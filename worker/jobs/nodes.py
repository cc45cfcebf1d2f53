"""Nodes: the workers that share one work root (one host, or one volume) — where a kept workspace lives.

A node's id is made once and kept in its work root (``<work root>/.skillrun/node-id``), so every worker process on
that root, now or after a restart, is the same node, and workers with roots of their own (other machines, other
volumes) are other nodes. Each worker process beats for its node (``NodeBeat``: the node's entry in the sorted set
``skillrun:<runtime>:nodes``, scored by the time of the latest beat) and for itself, and takes jobs from its node's own queue
(``skillrun:<runtime>:node:<id>``) before the runtime's shared one: the runs of the kept workspaces that live there,
and their removals. A node none of whose workers beat for ``NODE_GONE_SECONDS`` is gone, and so are its workspaces.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
import threading
import time
from pathlib import Path

import redis

NODE_FILE = "node-id"
NODE_ID = re.compile(r"[0-9a-f]{16}")
NODE_BEAT_SECONDS = 5.0
"""How often a worker process beats for its node."""
NODE_GONE_SECONDS = 60.0
"""Silence after which a node (all its workers) is gone: its workspaces are lost."""
NODE_FORGET_SECONDS = 7 * 24 * 3600.0
"""Silence after which a gone node is forgotten (its entry and its queue)."""
WORKER_BEAT_TTL_SECONDS = 15
"""How long a worker process's own beat (``skillrun:worker:<name>``) outlives it: a job in RQ's started registry
whose worker has no beat was taken by a worker that is gone (RQ's own entry outlives a killed worker by minutes)."""


def worker_beat_key(worker_name: str) -> str:
    return f"skillrun:worker:{worker_name}"


def nodes_key(runtime: str) -> str:
    return f"skillrun:{runtime}:nodes"


def node_queue_name(runtime: str, node: str) -> str:
    return f"skillrun:{runtime}:node:{node}"


def node_id(work_root: Path) -> str:
    """This work root's node id, made the first time it is asked for (written aside and linked into place: two
    workers starting together agree on one)."""
    folder = work_root / ".skillrun"
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = folder / NODE_FILE
    for _ in range(2):
        try:
            found = path.read_text().strip()
        except FileNotFoundError:
            fd, aside = tempfile.mkstemp(prefix="tmp-node-", dir=folder)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(8))
            try:
                os.link(aside, path)  # fails if another worker placed its id first: that one is read then
            except FileExistsError:
                pass
            finally:
                os.unlink(aside)
            continue
        if NODE_ID.fullmatch(found):
            return found
        raise RuntimeError(f"{path} holds no node id ({found[:40]!r}); remove it and start the worker again")
    raise RuntimeError(f"could not make {path}")


def live_nodes(connection: redis.Redis, runtime: str, now: float | None = None) -> list[str]:
    """The nodes of ``runtime`` whose workers beat within ``NODE_GONE_SECONDS``."""
    since = (time.time() if now is None else now) - NODE_GONE_SECONDS
    return [node.decode() for node in connection.zrangebyscore(nodes_key(runtime), since, "+inf")]


def node_alive(connection: redis.Redis, runtime: str, node: str) -> bool:
    beat = connection.zscore(nodes_key(runtime), node)
    return beat is not None and beat >= time.time() - NODE_GONE_SECONDS


class NodeBeat:
    """A daemon thread beating for ``node`` and for the worker process ``worker_name`` every ``NODE_BEAT_SECONDS``
    while that process lives (a missed beat — Redis away for a moment — is made up at the next)."""

    def __init__(self, connection: redis.Redis, runtime: str, node: str, worker_name: str) -> None:
        self.connection, self.key, self.node = connection, nodes_key(runtime), node
        self.worker_key = worker_beat_key(worker_name)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name=f"node-beat-{node}")

    def start(self) -> "NodeBeat":
        self.beat()
        self._thread.start()
        return self

    def beat(self) -> None:
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.zadd(self.key, {self.node: time.time()})
            pipe.set(self.worker_key, self.node, ex=WORKER_BEAT_TTL_SECONDS)
            pipe.execute()

    def _beat(self) -> None:
        while not self._stop.wait(NODE_BEAT_SECONDS):
            try:
                self.beat()
            except redis.RedisError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        try:
            self.connection.delete(self.worker_key)
        except redis.RedisError:
            pass  # it expires
