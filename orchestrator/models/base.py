"""The model interface: an ``LlmRequest`` in, a stream of ``LlmResponse``s out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.events import Usage
from orchestrator.types import Content


@dataclass
class LlmRequest:
    """What one model call is asked: instructions, history, tool declarations."""

    system_instruction: str = ""
    contents: list[Content] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    streaming_tools: set[str] = field(default_factory=set)
    parallel_tool_calls: bool = True
    stream: bool = True

    def append_instructions(self, instructions: list[str]) -> None:
        """Add paragraphs to the system instruction (tools do this in ``process_request``)."""
        text = "\n\n".join(i for i in instructions if i)
        if text:
            self.system_instruction = f"{self.system_instruction}\n\n{text}" if self.system_instruction else text


@dataclass
class LlmResponse:
    """A model answer or a piece of one (``partial``). The last response of a stream is complete."""

    content: Content | None = None
    partial: bool = False
    streaming_tool_call: bool = False
    usage: Usage | None = None
    finish_reason: str | None = None
    malformed_calls: dict[str, str] = field(default_factory=dict)
    """Tool-call id → the raw argument text that was not a JSON object."""


class LLMModel(ABC):
    """A chat model."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    @abstractmethod
    def generate_content_async(self, request: LlmRequest) -> AsyncIterator[LlmResponse]:
        """Stream the answer to ``request``; the last item is the complete response."""

    async def close(self) -> None:
        """Release connections."""
