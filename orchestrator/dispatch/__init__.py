"""Dispatch: handing run requests to runtimes, and following them.

Every caller (the CLI, the ``skill_run`` tool, the HTTP API) goes through a dispatcher, so moving runs onto a
queue changes one object, not its callers: ``InlineDispatcher`` (the embedded default, ``inline``) or
``QueueDispatcher`` (Redis and workers, ``queue``); what they share, waiting included, is in ``base``;
``dispatcher_for`` (``factory``) picks one from the settings.
"""

from orchestrator.dispatch.base import BaseDispatcher, Removal, WorkerStatus, WorkspaceConflictError, redis_errors
from orchestrator.dispatch.factory import dispatcher_for, secret_store_for
from orchestrator.dispatch.inline import InlineDispatcher
from orchestrator.dispatch.queue import QueueDispatcher

__all__ = ["BaseDispatcher", "InlineDispatcher", "QueueDispatcher", "Removal", "WorkerStatus", "WorkspaceConflictError",
           "dispatcher_for", "redis_errors", "secret_store_for"]
