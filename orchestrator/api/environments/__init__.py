"""Skills' dependency environments as the API shows them, and who builds a newly registered library version's."""

from orchestrator.api.environments.base import EnvironmentsReport, LibraryEnvironments, not_ready
from orchestrator.api.environments.factory import environments_for
from orchestrator.api.environments.inline import InlineEnvironments
from orchestrator.api.environments.queued import BUILDS_KEY, QueuedEnvironments

__all__ = ["BUILDS_KEY", "EnvironmentsReport", "InlineEnvironments", "LibraryEnvironments", "QueuedEnvironments",
           "environments_for", "not_ready"]
