"""The web console: server-rendered pages at ``/ui`` for a team's skills, runs and libraries, and an operator view,
signed in with a team API key. ``mount_console`` puts it into the API app."""

from orchestrator.console.mount import mount_console
from orchestrator.console.sessions import (
    BaseConsoleSessions,
    ConsoleSession,
    MemoryConsoleSessions,
    RedisConsoleSessions,
)

__all__ = ["BaseConsoleSessions", "ConsoleSession", "MemoryConsoleSessions", "RedisConsoleSessions", "mount_console"]
