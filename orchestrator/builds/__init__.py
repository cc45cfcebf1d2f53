"""The build dispatcher, beside the run dispatcher (``orchestrator.dispatch``): who builds a newly registered library
version's dependency environments — the queue's workers (``queued``) or this process's runtimes (``inline``) —
held to the team's build quota, and the environments' state as the API and the console show it (``base``)."""

from orchestrator.builds.base import EnvironmentsReport, LibraryEnvironments, not_ready
from orchestrator.builds.factory import environments_for
from orchestrator.builds.inline import InlineEnvironments
from orchestrator.builds.queued import BUILDS_KEY, QueuedEnvironments

__all__ = ["BUILDS_KEY", "EnvironmentsReport", "InlineEnvironments", "LibraryEnvironments", "QueuedEnvironments",
           "environments_for", "not_ready"]
