"""A process-wide registry of named tools: ``@register_tool`` and ``get_tool``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.errors import ToolError
from orchestrator.tools.base import BaseTool
from orchestrator.tools.function_tool import FunctionTool

_REGISTRY: dict[str, BaseTool] = {}


def register_tool(
    name: str = "", description: str = "", filters_name: list[str] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as a ``FunctionTool`` under ``name`` (default: the function's name).

    The function itself is returned unchanged. Registering another function under a taken name is an error;
    registering the same function again (a module reloaded) replaces the entry.
    """

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        tool = FunctionTool(func, name=name or None, description=description or None, filters_name=filters_name)
        existing = _REGISTRY.get(tool.name)
        if isinstance(existing, FunctionTool) and _origin(existing.func) != _origin(func):
            raise ToolError(f"a different tool is already registered as {tool.name!r} ({_origin(existing.func)})")
        _REGISTRY[tool.name] = tool
        return func

    return decorate


def get_tool(name: str) -> BaseTool | None:
    """The tool registered as ``name``, or ``None``."""
    return _REGISTRY.get(name)


def registered_tools() -> dict[str, BaseTool]:
    return dict(_REGISTRY)


def _origin(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"
