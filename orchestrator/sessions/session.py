"""A session: one conversation's events and state."""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, Field

from orchestrator.errors import SessionError
from orchestrator.events import Event
from orchestrator.text import check_text

TEMP_PREFIX = "temp:"
"""State keys with this prefix live for one invocation and are never persisted."""


class Session(BaseModel):
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    app_name: str
    user_id: str
    state: dict[str, Any] = Field(default_factory=dict)
    events: list[Event] = Field(default_factory=list)
    last_update_time: float = Field(default_factory=time.time)


def persistent_delta(delta: dict[str, Any]) -> dict[str, Any]:
    """The part of a state delta that is kept in the session (everything but ``temp:`` keys)."""
    return {k: v for k, v in delta.items() if not k.startswith(TEMP_PREFIX)}


def apply_delta(state: dict[str, Any], delta: dict[str, Any]) -> None:
    """Apply a (persistent) state delta: a ``None`` value removes the key."""
    for key, value in delta.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value


def kept_event(event: Event) -> Event:
    """What a store keeps of ``event``: a copy without its ``temp:`` state keys, its text checked
    (``UnencodableTextError``, before anything is stored)."""
    kept = event.model_copy(deep=True)
    kept.actions.state_delta = persistent_delta(kept.actions.state_delta)
    check_text(kept, "event")
    return kept


def new_session(app_name: str, user_id: str, session_id: str | None, state: dict[str, Any] | None) -> Session:
    """A new session (with a generated id unless one is given), keeping only the persistent part of ``state``, its
    text checked (``UnencodableTextError``, before anything is stored)."""
    session = Session(app_name=app_name, user_id=user_id, state=persistent_delta(dict(state or {})))
    if session_id is not None:
        session.id = session_id
    check_text(session)
    return session


def already_exists(session: Session) -> SessionError:
    return SessionError(f"session {session.id!r} already exists for {session.user_id!r} in {session.app_name!r}")
