"""The console's operator view: queue depth per runtime, the workers and their last heartbeat, runs per minute and
failures. Only counts and workers are shown (what ``/metrics`` already tells anyone): no other team's runs."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from orchestrator.api.deps import get_services
from orchestrator.console.auth import PREFIX, signed_in
from orchestrator.console.render import page
from orchestrator.services import Services
from orchestrator.teams import Team
from worker.contract import RuntimeName
from worker.run_store import RunRecord, RunStatus

router = APIRouter(prefix=f"{PREFIX}/operator", include_in_schema=False)

MINUTES = 15
SCANNED = 1000
"""The newest runs (of every team) looked through for the minutes' counts."""


@dataclass(frozen=True)
class Minute:
    start: float
    ended: int
    failed: int
    cancelled: int


def per_minute(records: list[RunRecord], now: float, minutes: int = MINUTES) -> list[Minute]:
    """Runs that ended in each of the last ``minutes`` whole minutes and the current one, newest first."""
    this_minute = now - now % 60
    counts = {this_minute - 60 * i: [0, 0, 0] for i in range(minutes + 1)}
    for record in records:
        if record.finished_at is None or not record.status.done:
            continue
        bucket = counts.get(record.finished_at - record.finished_at % 60)
        if bucket is not None:
            bucket[0] += 1
            bucket[1] += record.status == RunStatus.FAILED or bool(record.result and record.result.exit_code != 0)
            bucket[2] += record.status == RunStatus.CANCELLED
    return [Minute(start, *values) for start, values in sorted(counts.items(), reverse=True)]


@router.get("", response_class=HTMLResponse)
async def operator_page(request: Request, team: Team = Depends(signed_in),
                        services: Services = Depends(get_services)) -> HTMLResponse:
    depths = {runtime.value: 0 for runtime in RuntimeName} | await services.dispatcher.queue_depths()
    workers = await services.dispatcher.workers()
    recent = await services.dispatcher.list(None, SCANNED)
    minutes = per_minute(recent, time.time())
    return page(request, "operator.html", depths=sorted(depths.items()), workers=workers, minutes=minutes,
                running=sum(r.status == RunStatus.STARTED for r in recent), now=time.time())
