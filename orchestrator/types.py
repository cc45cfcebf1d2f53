"""Message content exchanged with models and stored in sessions: ``Content`` made of ``Part``s.

A part is text (``thought=True`` for reasoning the endpoint sent), a ``FunctionCall`` the model made, or the
``FunctionResponse`` a tool gave back.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class FunctionCall(BaseModel):
    """A tool call made by the model."""

    id: str = ""
    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class FunctionResponse(BaseModel):
    """What a tool returned for a call."""

    id: str = ""
    name: str
    response: dict[str, Any] = Field(default_factory=dict)


class Part(BaseModel):
    """One piece of a message."""

    text: str | None = None
    thought: bool = False
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None

    @classmethod
    def from_text(cls, text: str) -> "Part":
        return cls(text=text)

    @classmethod
    def from_function_call(cls, name: str, args: dict[str, Any], id: str = "") -> "Part":  # noqa: A002
        return cls(function_call=FunctionCall(id=id, name=name, args=args))

    @classmethod
    def from_function_response(cls, name: str, response: dict[str, Any], id: str = "") -> "Part":  # noqa: A002
        return cls(function_response=FunctionResponse(id=id, name=name, response=response))


class Content(BaseModel):
    """A message: who sent it and its parts."""

    role: Literal["user", "model", "tool", "system"] = "user"
    parts: list[Part] = Field(default_factory=list)

    @property
    def text(self) -> str:
        """The non-thought text of all parts, joined."""
        return "".join(p.text for p in self.parts if p.text and not p.thought)
