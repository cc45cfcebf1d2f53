"""Where a queued run goes: the node its kept workspace lives on, else its runtime's shared queue (``worker.jobs.nodes``).

A kept workspace is placed when its first run is accepted: on one of the runtime's live nodes, picked at random
(none alive: the first worker that starts one of its runs places it on its own node). Its later runs, and its
removal, go to that node's queue, so ``work/`` and ``out/`` persist with no shared disk. When that node is gone (no
worker of it beat for ``NODE_GONE_SECONDS``) the workspace is lost: a new run of it is refused with
``workspace_lost`` (remove it, or run in a new workspace), runs already queued or retried there fail with that
reason, and removing it only forgets its entry (its files went with the node).
"""

from __future__ import annotations

import random
import time

import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from worker.contract import RunRequest
from worker.jobs import (
    NODE_FORGET_SECONDS,
    NODE_GONE_SECONDS,
    TeamGate,
    live_nodes,
    node_alive,
    node_queue_name,
    nodes_key,
    queue_name,
)
from worker.run_store import RedisWorkspaces, RunRecord, WorkspaceEntry, WorkspaceRefusedError

LOST = "workspace_lost"


def lost_reason(workspace_id: str, node: str) -> str:
    return (f"{LOST}: workspace {workspace_id!r} lived on node {node}, none of whose workers has been seen for "
            f"{NODE_GONE_SECONDS:g} s; its files went with it. Remove it (DELETE /v1/workspaces/…) or run in a new "
            "workspace")


class Placement:
    """Placement of kept workspaces on nodes, and the queue each run goes to."""

    def __init__(self, connection: redis.Redis, workspaces: RedisWorkspaces, gate: TeamGate) -> None:
        self.redis = connection
        self.workspaces = workspaces
        self.gate = gate

    def propose(self, request: RunRequest) -> str | None:
        """The node a new kept workspace of ``request`` would be placed on (``None``: no live node); a run of a
        workspace whose node is gone is refused (``WorkspaceRefusedError``, ``workspace_lost``)."""
        node = self.workspaces.node(request.workspace_id)
        if node is not None:
            if not self.alive(request.runtime.value, node):
                raise WorkspaceRefusedError(lost_reason(request.workspace_id, node))
            return node
        nodes = live_nodes(self.redis, request.runtime.value)
        return random.choice(nodes) if nodes else None

    def alive(self, runtime: str, node: str) -> bool:
        return node_alive(self.redis, runtime, node)

    def queue_of(self, record: RunRecord) -> tuple[str, str | None]:
        """The queue ``record``'s next attempt goes to, and why it can never start there (its workspace's node is
        gone), if so."""
        runtime = record.request.runtime.value
        node = self.workspaces.node(record.request.workspace_id) if record.request.keep_workspace else None
        if node is None:
            return queue_name(runtime), None
        lost = None if self.alive(runtime, node) else lost_reason(record.request.workspace_id, node)
        return node_queue_name(runtime, node), lost

    def removal_queue_of(self, entry: WorkspaceEntry, shared: str) -> str | None:
        """Where ``entry``'s removal goes: its node's queue, ``shared`` when it was never placed, ``None`` when its
        node is gone."""
        if entry.node is None:
            return shared
        runtime = entry.runtime.value
        return node_queue_name(runtime, entry.node) if self.alive(runtime, entry.node) else None

    def nodes(self, runtime: str) -> tuple[list[str], list[str]]:
        """The runtime's nodes: alive, and gone (not forgotten yet)."""
        since = time.time() - NODE_GONE_SECONDS
        alive, gone = [], []
        for node, beat in self.redis.zrange(nodes_key(runtime), 0, -1, withscores=True):
            (alive if beat >= since else gone).append(node.decode())
        return alive, gone

    def forget_gone(self, runtime: str) -> int:
        """Forget the nodes silent for ``NODE_FORGET_SECONDS``: their entries and queues; how many."""
        old = [n.decode() for n in self.redis.zrangebyscore(nodes_key(runtime), "-inf", time.time() - NODE_FORGET_SECONDS)]
        for node in old:  # the queue with its jobs' records and its teams' lines, then the node
            Queue(node_queue_name(runtime, node), connection=self.redis, serializer=JSONSerializer).empty()
            lined = self.gate.waiting(node_queue_name(runtime, node))
            if lined:  # the jobs' records, as the queue's went with it
                self.redis.delete(*(Job.key_for(job_id) for job_id in lined))
            self.gate.forget(node_queue_name(runtime, node))
            self.redis.zrem(nodes_key(runtime), node)
        return len(old)
