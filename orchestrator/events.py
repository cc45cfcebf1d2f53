"""Events: what an agent run yields and what a session stores."""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, Field

from orchestrator.types import Content


class EventActions(BaseModel):
    """Side effects an event carries: state changes, and whether a tool result ends the turn."""

    state_delta: dict[str, Any] = Field(default_factory=dict)
    skip_summarization: bool = False


class Usage(BaseModel):
    """Token counts the model reported for one response."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class Event(BaseModel):
    """One step of an invocation: a (partial) model message, a tool call, a tool result, or an error."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    invocation_id: str = ""
    author: str = ""
    content: Content | None = None
    partial: bool = False
    streaming_tool_call: bool = False
    actions: EventActions = Field(default_factory=EventActions)
    usage: Usage | None = None
    error_code: str | None = None
    error_message: str | None = None
    timestamp: float = Field(default_factory=time.time)

    def is_streaming_tool_call(self) -> bool:
        """A partial event carrying a delta of a streaming tool's arguments (under ``TOOL_STREAMING_ARGS``)."""
        return self.partial and self.streaming_tool_call

    def function_calls(self):
        return [p.function_call for p in (self.content.parts if self.content else []) if p.function_call]

    def function_responses(self):
        return [p.function_response for p in (self.content.parts if self.content else []) if p.function_response]

    def is_final_response(self) -> bool:
        """A complete model message with no tool call: the agent's answer for this turn."""
        return not self.partial and self.author != "user" and bool(self.content) and not self.function_calls() and not self.function_responses()
