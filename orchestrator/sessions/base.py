"""The session service interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from orchestrator.events import Event
from orchestrator.sessions.session import Session


class BaseSessionService(ABC):
    """Creates, stores and finds sessions; appends events and applies their persistent state changes."""

    @abstractmethod
    async def create_session(
        self, *, app_name: str, user_id: str, session_id: str | None = None, state: dict[str, Any] | None = None
    ) -> Session: ...

    @abstractmethod
    async def get_session(self, *, app_name: str, user_id: str, session_id: str) -> Session | None: ...

    @abstractmethod
    async def list_sessions(self, *, app_name: str, user_id: str) -> list[Session]: ...

    @abstractmethod
    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None: ...

    @abstractmethod
    async def append_event(self, session: Session, event: Event) -> Event:
        """Store ``event`` in ``session`` (partial events are not stored) and apply its persistent state delta."""

    async def close(self) -> None:
        """Release connections."""
