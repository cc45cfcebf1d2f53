"""The agent interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

from orchestrator.context import InvocationContext
from orchestrator.events import Event


class BaseAgent(ABC):
    """Something that answers an invocation with a stream of events."""

    def __init__(self, name: str, description: str = "") -> None:
        self.name = name
        self.description = description

    @abstractmethod
    def run_async(self, ctx: InvocationContext) -> AsyncIterator[Event]:
        """Handle the invocation whose user message is the last event of ``ctx.session``."""

    async def close(self) -> None:
        """Release what the agent holds (tool sets, model clients)."""
