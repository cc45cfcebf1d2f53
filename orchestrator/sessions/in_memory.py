"""Sessions kept in this process's memory."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.errors import SessionError
from orchestrator.events import Event
from orchestrator.sessions.base import BaseSessionService
from orchestrator.sessions.session import Session, already_exists, apply_delta, kept_event, new_session


class InMemorySessionService(BaseSessionService):
    """Sessions in a dict; every read returns a copy, so callers cannot change stored sessions by accident."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str, str], Session] = {}

    async def create_session(
        self, *, app_name: str, user_id: str, session_id: str | None = None, state: dict[str, Any] | None = None
    ) -> Session:
        session = new_session(app_name, user_id, session_id, state)
        key = (app_name, user_id, session.id)
        if key in self._sessions:
            raise already_exists(session)
        self._sessions[key] = session
        return session.model_copy(deep=True)

    async def get_session(self, *, app_name: str, user_id: str, session_id: str) -> Session | None:
        session = self._sessions.get((app_name, user_id, session_id))
        return session.model_copy(deep=True) if session else None

    async def list_sessions(self, *, app_name: str, user_id: str) -> list[Session]:
        return [s.model_copy(deep=True) for (a, u, _), s in self._sessions.items() if a == app_name and u == user_id]

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        self._sessions.pop((app_name, user_id, session_id), None)

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        stored = self._sessions.get((session.app_name, session.user_id, session.id))
        if stored is None:
            raise SessionError(f"session {session.id!r} does not exist")
        kept = kept_event(event)
        for target in (stored, session):
            apply_delta(target.state, kept.actions.state_delta)
            target.events.append(kept)
            target.last_update_time = time.time()
        return event
