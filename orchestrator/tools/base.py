"""The tool interface: a name, a description, a JSON schema for its arguments, and ``run_async``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from orchestrator.context import InvocationContext

if TYPE_CHECKING:  # annotations only: importing the models package would load the model SDK
    from orchestrator.models.base import LlmRequest


class BaseTool(ABC):
    """Something a model can call."""

    def __init__(
        self, name: str, description: str = "", filters_name: list[str] | None = None, filters: list | None = None
    ) -> None:
        self.name = name
        self.description = description
        self.filters_name = list(filters_name or [])
        self.filters = list(filters or [])

    @property
    def is_streaming(self) -> bool:
        """Whether the model's argument deltas for this tool are streamed as events."""
        return False

    def parameters_schema(self) -> dict[str, Any]:
        """JSON schema of the arguments (an object)."""
        return {"type": "object", "properties": {}}

    def declaration(self) -> dict[str, Any]:
        """The function declaration sent to the model."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters_schema()}

    async def process_request(self, *, tool_context: InvocationContext, llm_request: "LlmRequest") -> None:
        """Adjust a model request this tool is declared in before it is sent (add instructions, say); by default
        nothing."""

    async def run_async(self, *, tool_context: InvocationContext, args: dict[str, Any]) -> Any:
        return await self._run_async_impl(tool_context=tool_context, args=args)

    @abstractmethod
    async def _run_async_impl(self, *, tool_context: InvocationContext, args: dict[str, Any]) -> Any:
        """Do the work; return a dict (anything else is wrapped as ``{"result": ...}``)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
