"""Sessions: conversation events and state, and the services that keep them."""

from orchestrator.sessions.base import BaseSessionService
from orchestrator.sessions.in_memory import InMemorySessionService
from orchestrator.sessions.session import TEMP_PREFIX, Session

__all__ = ["BaseSessionService", "InMemorySessionService", "Session", "TEMP_PREFIX"]
