"""``environments_for(dispatcher)``: who builds for this API — the queue's workers, or this process's runtimes."""

from __future__ import annotations

from orchestrator.builds.base import LibraryEnvironments
from orchestrator.builds.inline import InlineEnvironments
from orchestrator.builds.queued import QueuedEnvironments
from orchestrator.config import get_settings
from orchestrator.dispatch import BaseDispatcher, QueueDispatcher
from worker.config import get_worker_settings


def environments_for(dispatcher: BaseDispatcher, runtimes: list[str] | None = None) -> LibraryEnvironments:
    """Who builds for this API, for ``runtimes`` (default ``SKILLRUN_PREPARE_RUNTIMES``): the queue's workers, or
    this process's runtimes; builds are held to the quotas the dispatcher holds runs to."""
    runtimes = runtimes or get_settings().runtimes_to_prepare()
    if isinstance(dispatcher, QueueDispatcher):
        return QueuedEnvironments(dispatcher.redis, runtimes, dispatcher.team_quota, workers=get_worker_settings())
    return InlineEnvironments(dispatcher.runtime, runtimes, dispatcher.team_quota)
