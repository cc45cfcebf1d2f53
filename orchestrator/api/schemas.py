"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from orchestrator.events import Event


class SessionCreate(BaseModel):
    """A new session; the id is generated when not given."""

    session_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,64}$")
    state: dict[str, Any] = Field(default_factory=dict)


class SessionPublic(BaseModel):
    id: str
    app_name: str
    user_id: str
    state: dict[str, Any]
    events: list[Event]
    last_update_time: float


class MessageCreate(BaseModel):
    """A user message to the session's agent."""

    text: str = Field(min_length=1)


class Health(BaseModel):
    status: str
    skills: int
