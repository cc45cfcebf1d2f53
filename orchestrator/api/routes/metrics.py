"""``GET /metrics``: Prometheus text — queue depth per runtime, runs by status, run duration histogram."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse

from orchestrator.api.deps import get_services
from orchestrator.services import Services
from worker.run_store import DURATION_BUCKETS_SECONDS

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(services: Services = Depends(get_services)) -> str:
    """Metrics in the Prometheus text format."""
    depths = await services.dispatcher.queue_depths()
    stats = await asyncio.to_thread(services.dispatcher.store.stats)
    lines = ["# HELP skillrun_queue_depth Runs waiting to start, per runtime.", "# TYPE skillrun_queue_depth gauge"]
    lines += [f'skillrun_queue_depth{{runtime="{runtime}"}} {n}' for runtime, n in sorted(depths.items())]
    lines += ["# HELP skillrun_runs Runs by status.", "# TYPE skillrun_runs gauge"]
    lines += [f'skillrun_runs{{status="{s}"}} {n}' for s, n in sorted(stats["status"].items())]
    lines += ["# HELP skillrun_run_duration_seconds Duration of ended runs.", "# TYPE skillrun_run_duration_seconds histogram"]
    cumulative = 0
    for bound in [f"{b:g}" for b in DURATION_BUCKETS_SECONDS] + ["+Inf"]:
        cumulative += stats["duration_buckets"].get(bound, 0)
        lines.append(f'skillrun_run_duration_seconds_bucket{{le="{bound}"}} {cumulative}')
    lines.append(f"skillrun_run_duration_seconds_sum {stats['duration_sum']}")
    lines.append(f"skillrun_run_duration_seconds_count {cumulative}")
    return "\n".join(lines) + "\n"
