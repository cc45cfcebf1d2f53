"""The invocation context: what an agent, a tool or a toolset sees of the current invocation.

``state`` merges, in this order, the session's persisted state, this invocation's ``temp:`` state, and the
state delta of the current step; writing to it records a change in ``actions.state_delta``, which the runner
applies when the step's event passes (``temp:`` keys only for this invocation, the others in the session).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

from orchestrator.events import EventActions
from orchestrator.sessions.session import TEMP_PREFIX, Session

if TYPE_CHECKING:  # only for annotations: agents import this module
    from orchestrator.agents.base import BaseAgent
    from orchestrator.sessions.base import BaseSessionService


class State(MutableMapping[str, Any]):
    """A merged view of session state, invocation temp state and the current delta."""

    def __init__(self, context: "InvocationContext") -> None:
        self._ctx = context

    def _layers(self) -> list[dict[str, Any]]:
        return [self._ctx.actions.state_delta, self._ctx.temp_state, self._ctx.session.state]

    def __getitem__(self, key: str) -> Any:
        for layer in self._layers():
            if key in layer:
                return layer[key]
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        self._ctx.actions.state_delta[key] = value

    def __delitem__(self, key: str) -> None:
        self._ctx.actions.state_delta[key] = None

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for layer in self._layers():
            for key in layer:
                if key not in seen:
                    seen.add(key)
                    yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)


class InvocationContext:
    """One invocation of an agent (one user message and everything it causes)."""

    def __init__(
        self,
        *,
        session: Session,
        agent: "BaseAgent",
        session_service: "BaseSessionService | None" = None,
        invocation_id: str | None = None,
        temp_state: dict[str, Any] | None = None,
        actions: EventActions | None = None,
        function_call_id: str | None = None,
    ) -> None:
        self.session = session
        self.agent = agent
        self.session_service = session_service
        self.invocation_id = invocation_id or uuid.uuid4().hex
        self.temp_state: dict[str, Any] = temp_state if temp_state is not None else {}
        self.actions = actions or EventActions()
        self.function_call_id = function_call_id

    @property
    def state(self) -> State:
        return State(self)

    @property
    def user_id(self) -> str:
        return self.session.user_id

    @property
    def app_name(self) -> str:
        return self.session.app_name

    def for_tool_call(self, function_call_id: str) -> "InvocationContext":
        """A context for one tool call: same invocation, its own ``actions``."""
        return InvocationContext(
            session=self.session, agent=self.agent, session_service=self.session_service,
            invocation_id=self.invocation_id, temp_state=self.temp_state, function_call_id=function_call_id,
        )

    def for_agent(self, agent: "BaseAgent") -> "InvocationContext":
        return InvocationContext(
            session=self.session, agent=agent, session_service=self.session_service,
            invocation_id=self.invocation_id, temp_state=self.temp_state,
        )

    def apply_temp_delta(self, delta: dict[str, Any]) -> None:
        """Record the ``temp:`` part of a delta for the rest of this invocation."""
        for key, value in delta.items():
            if key.startswith(TEMP_PREFIX):
                if value is None:
                    self.temp_state.pop(key, None)
                else:
                    self.temp_state[key] = value
