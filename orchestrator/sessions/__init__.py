"""Sessions: conversation events and state, and the services that keep them."""

from orchestrator.sessions.base import BaseSessionService
from orchestrator.sessions.file import FileSessionService
from orchestrator.sessions.in_memory import InMemorySessionService
from orchestrator.sessions.redis import RedisSessionService
from orchestrator.sessions.session import TEMP_PREFIX, Session

__all__ = ["BaseSessionService", "FileSessionService", "InMemorySessionService", "RedisSessionService", "Session", "TEMP_PREFIX"]
