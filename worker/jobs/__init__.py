"""The queue: the job function that executes a stored run (``execute``), the consumer behind ``skillrun worker``,
RQ's worker class, fair turns between teams, nodes, and the workers' token."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.jobs.execute": ["execute_run", "prepare_environments", "remove_kept_workspace", "remove_one_off_workspace"],
    "worker.jobs.consumer": ["queue_name", "serve_worker"],
    "worker.jobs.fair_queue": ["FairQueue", "TeamGate"],
    "worker.jobs.nodes": ["NodeBeat", "live_nodes"],
    "worker.jobs.queue_worker": ["RunWorker"],
})
