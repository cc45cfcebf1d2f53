"""The queue: the one core that executes a started run (``core``), the job function over it (``execute``), the
consumer behind ``skillrun worker``, RQ's worker class, fair turns between teams, nodes, and the workers' token."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.jobs.core": ["Ended", "execute_started"],
    "worker.jobs.execute": ["PREPARE_BEAT_KEY", "WAITING", "execute_run", "prepare_environments", "prune_artifacts",
                            "remove_kept_workspace", "remove_lost_runs_workspace", "remove_one_off_workspace"],
    "worker.jobs.consumer": ["environments_queue_name", "queue_name", "serve_worker", "workspaces_queue_name"],
    "worker.jobs.fair_queue": ["FairQueue", "TeamGate", "team_of"],
    "worker.jobs.nodes": ["NODE_FORGET_SECONDS", "NODE_GONE_SECONDS", "NodeBeat", "live_nodes", "node_alive",
                          "node_queue_name", "nodes_key", "worker_beat_key"],
    "worker.jobs.queue_worker": ["RunWorker"],
    "worker.jobs.tokens": ["usable_worker_token"],
})
