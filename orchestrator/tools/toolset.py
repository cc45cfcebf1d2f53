"""Tool sets: a group of tools whose members may depend on the invocation."""

from __future__ import annotations

from abc import ABC, abstractmethod

from orchestrator.context import InvocationContext
from orchestrator.tools.base import BaseTool


class BaseToolSet(ABC):
    """A group of tools. ``get_tools`` may look at the invocation (session state, user) to choose its members."""

    def __init__(self, name: str = "", filters_name: list[str] | None = None) -> None:
        self.name = name or type(self).__name__
        self.filters_name = list(filters_name or [])
        self._initialized = False

    def initialize(self) -> None:
        """Create resources and tools; called once before first use (again is harmless)."""
        self._initialized = True

    @abstractmethod
    async def get_tools(self, invocation_context: InvocationContext | None = None) -> list[BaseTool]:
        """The tools available for this invocation."""

    async def close(self) -> None:
        """Release resources (connections, processes)."""
