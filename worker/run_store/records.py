"""What a run store keeps of a run: its record (request, status, result, attempts, worker) and its events.

Statuses go ``queued → started → finished | failed | cancelled``; each change is also an event (``queued``,
``started``, ``finished``, ``failed``, ``cancelled``, ``cancelling``, ``retried``) that watchers can wait for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from worker.contract import RunRequest, RunResult

DURATION_BUCKETS_SECONDS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0)


def duration_bucket(seconds: float) -> str:
    """The histogram bucket (upper bound, as Prometheus' ``le``) a run duration falls in."""
    return next((f"{b:g}" for b in DURATION_BUCKETS_SECONDS if seconds <= b), "+Inf")


class RunStatus(str, Enum):
    QUEUED = "queued"
    STARTED = "started"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        return self in {RunStatus.FINISHED, RunStatus.FAILED, RunStatus.CANCELLED}


ENDING_EVENTS = frozenset(status.value for status in RunStatus if status.done)
"""The event types after which a run's event stream has nothing more to say."""


_NO_VALUE_STRINGS_KEPT = ConfigDict(cache_strings="keys")
"""Parsing a record keeps none of its values (run and workspace ids) in pydantic's process-wide string cache: with
the default, every record parsed left ~80 bytes there until 16,384 were held."""


class RunEvent(BaseModel):
    model_config = _NO_VALUE_STRINGS_KEPT

    type: str
    at: float = Field(default_factory=time.time)
    data: dict[str, Any] = Field(default_factory=dict)


class RunRecord(BaseModel):
    model_config = _NO_VALUE_STRINGS_KEPT

    id: str
    request: RunRequest
    status: RunStatus = RunStatus.QUEUED
    result: RunResult | None = None
    error: str | None = None
    worker_id: str | None = None
    node: str | None = None
    """The node (work root) of the worker that started its latest attempt (queue mode)."""
    attempts: int = 0
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    cancel_requested: bool = False
    owner: str | None = None
    """Who submitted the run (a team); only they see it."""
    artifact_bytes_reserved: int = 0
    """What the run holds of its team's quota of stored artifacts (``max_artifact_bytes``) from when it was accepted
    until it ends, however it ends: its ``limits.artifact_total_bytes`` as accepted (lowered to the room left). Once
    it ended, the bytes its result's artifacts hold are tallied instead."""


Mutation = Callable[[RunRecord], "RunEvent | None"]
"""Edits a copy of a record in place and returns the event to record, or ``None`` to leave the record as it is."""
