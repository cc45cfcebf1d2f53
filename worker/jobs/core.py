"""The one core that executes a started run, whoever started it: the RQ job (``worker.jobs.execute``) and the
in-process dispatcher (``orchestrator.dispatch.inline``) are adapters over it, each storing the ending its own way.

The run's team secrets are attached just before its command and dropped after it; its result is redacted of every
secret of the team, checked to be storable, and stamped with who ran it and how long it queued. A run that cannot
be executed (a bad request, an unusable runtime, a secret not there) ends with the reason, redacted too.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pydantic_core import PydanticSerializationError

from worker.contract import RunRequest, RunResult
from worker.errors import WorkerError
from worker.run_store.records import RunRecord
from worker.runtimes.base import BaseWorkspaceRuntime
from worker.secrets.redactor import Redactor
from worker.secrets.results import redact_result
from worker.secrets.store import SecretStore, attach_secrets, forget_secrets


@dataclass(frozen=True)
class Ended:
    """How a started run ended: its ``result``, or the ``error`` that failed it (``failure``, and its message with
    every secret of the team taken out: ``reason``, and ``said``, the same prefixed with the error's type;
    ``redacted`` when taking them out changed it)."""

    result: RunResult | None = None
    failure: Exception | None = None
    reason: str = ""
    said: str = ""
    redacted: bool = False


async def execute_started(
    request: RunRequest, record: RunRecord, runtime: BaseWorkspaceRuntime, secrets: SecretStore | None, who: str, *,
    allow_host_paths: bool = False,
) -> Ended:
    """Execute ``request`` on ``runtime`` as ``who``: the request of ``record``, a run this process just started
    (whose owner's secrets it gets, and whose times say how long it queued)."""
    redactor = Redactor({})
    try:
        try:
            if secrets is not None or request.secrets:  # a read of the team's secrets (a file, Redis)
                redactor = await asyncio.to_thread(attach_secrets, request, secrets, record.owner)
            result = await runtime.run(request, allow_host_paths=allow_host_paths)
        finally:
            forget_secrets(request)
    except Exception as exc:  # noqa: BLE001 - bad input, an unusable runtime, a secret not there: the run fails with why
        return _failed(exc, redactor)
    if redactor:  # linear in what the run gave back, yet megabytes: not on the event loop
        await asyncio.to_thread(redact_result, result, redactor, request.limits)
    try:
        result.model_dump_json()  # as a store writes it: a lone surrogate fails the run, saying why
    except PydanticSerializationError as exc:
        return _failed(WorkerError(f"the run's result holds text no store can keep ({exc})"), redactor)
    result.worker_id = who
    result.timings.queue_ms = round(((record.started_at or 0) - record.created_at) * 1000, 3)
    return Ended(result=result)


def _failed(exc: Exception, redactor: Redactor) -> Ended:
    said = f"{type(exc).__name__}: {exc}"
    return Ended(failure=exc, reason=redactor.text(str(exc)), said=redactor.text(said),
                 redacted=redactor.text(said) != said)


__all__ = ["Ended", "execute_started"]
