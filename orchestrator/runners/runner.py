"""The runner: drives one agent over a session service, one user message at a time."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from orchestrator.context import InvocationContext
from orchestrator.events import Event
from orchestrator.sessions.base import BaseSessionService
from orchestrator.sessions.in_memory import InMemorySessionService
from orchestrator.types import Content

if TYPE_CHECKING:  # annotations only: importing the agents package would load the model SDK
    from orchestrator.agents.base import BaseAgent


class Runner:
    """Runs ``agent`` for ``app_name``, keeping conversations in ``session_service``."""

    def __init__(self, app_name: str, agent: "BaseAgent", session_service: BaseSessionService | None = None) -> None:
        self.app_name = app_name
        self.agent = agent
        self.session_service = session_service or InMemorySessionService()

    async def run_async(self, *, user_id: str, session_id: str, new_message: Content) -> AsyncIterator[Event]:
        """Append ``new_message`` to the session and yield every event of the agent's answer.

        A missing session is created. Complete events are stored as they pass (``temp:`` state only for this
        invocation); partial events (text deltas, streaming tool-call deltas) are yielded and not stored.
        """
        session = await self.session_service.get_session(app_name=self.app_name, user_id=user_id, session_id=session_id)
        if session is None:
            session = await self.session_service.create_session(
                app_name=self.app_name, user_id=user_id, session_id=session_id
            )
        ctx = InvocationContext(
            session=session, agent=self.agent, session_service=self.session_service, invocation_id=uuid.uuid4().hex
        )
        message = new_message if new_message.role == "user" else new_message.model_copy(update={"role": "user"})
        user_event = Event(invocation_id=ctx.invocation_id, author="user", content=message)
        await self.session_service.append_event(session, user_event)
        async for event in self.agent.run_async(ctx):
            if not event.partial:
                event.invocation_id = ctx.invocation_id
                ctx.apply_temp_delta(event.actions.state_delta)
                await self.session_service.append_event(session, event)
            yield event

    async def close(self) -> None:
        """Close the agent's tool sets and model clients."""
        await self.agent.close()
