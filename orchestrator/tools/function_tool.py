"""Function tools: a Python function (sync or async) turned into a tool.

The argument schema comes from the type hints (``str, int, float, bool, list, dict``, ``Literal``, enums,
``Optional``, nested ``pydantic.BaseModel``s with their ``Field`` descriptions); per-parameter descriptions come
from the docstring's ``Args:`` section; parameters without a default are ``required``. A parameter named
``tool_context`` (or annotated ``InvocationContext``) receives the invocation context and is hidden from the model.
A result that is not a dict is wrapped as ``{"result": ...}``; an exception becomes ``{"error": ...}``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from orchestrator.context import InvocationContext
from orchestrator.tools.base import BaseTool
from orchestrator.tools.schema import split_docstring, type_schema

CONTEXT_PARAMETER = "tool_context"


def wrap_result(value: Any) -> dict[str, Any]:
    """A tool result as the dict the model receives."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):
        return value
    if isinstance(value, list):
        value = [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value]
    return {"result": value}


class FunctionTool(BaseTool):
    """A tool that calls ``func``."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        filters_name: list[str] | None = None,
        filters: list | None = None,
    ) -> None:
        self.func = func
        doc_description, self._param_docs = split_docstring(inspect.getdoc(func))
        super().__init__(
            name=name or getattr(func, "__name__", type(func).__name__),
            description=description if description is not None else doc_description,
            filters_name=filters_name,
            filters=filters,
        )
        self._signature = inspect.signature(func)
        try:
            self._hints = typing.get_type_hints(func)
        except (NameError, TypeError):
            self._hints = {}
        self._context_params = {
            p.name for p in self._signature.parameters.values()
            if p.name == CONTEXT_PARAMETER or self._hints.get(p.name) is InvocationContext
        }
        self._schema = self._build_schema()
        self._adapters = {
            p.name: TypeAdapter(self._hints[p.name]) for p in self._parameters() if p.name in self._hints
        }

    def _parameters(self) -> list[inspect.Parameter]:
        return [
            p for p in self._signature.parameters.values()
            if p.name not in self._context_params and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]

    def _build_schema(self) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        required: list[str] = []
        for param in self._parameters():
            schema = dict(type_schema(self._hints.get(param.name, param.annotation)))
            if param.name in self._param_docs:
                schema["description"] = self._param_docs[param.name]
            if param.default is inspect.Parameter.empty:
                required.append(param.name)
            properties[param.name] = schema
        schema = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        return schema

    def parameters_schema(self) -> dict[str, Any]:
        return self._schema

    async def _run_async_impl(self, *, tool_context: InvocationContext, args: dict[str, Any]) -> Any:
        kwargs: dict[str, Any] = {}
        problems: list[str] = []
        known = {p.name for p in self._parameters()}
        unexpected = sorted(set(args) - known)
        if unexpected:
            problems.append(f"unexpected argument(s): {', '.join(unexpected)}")
        for param in self._parameters():
            if param.name in args:
                adapter = self._adapters.get(param.name)
                try:
                    kwargs[param.name] = adapter.validate_python(args[param.name]) if adapter else args[param.name]
                except ValidationError as exc:
                    first = exc.errors()[0]
                    problems.append(f"{param.name}: {first['msg']}")
            elif param.default is inspect.Parameter.empty:
                problems.append(f"missing required argument: {param.name}")
        if problems:
            return {"error": f"invalid arguments for {self.name}: " + "; ".join(problems)}
        for name in self._context_params:
            kwargs[name] = tool_context
        if inspect.iscoroutinefunction(self.func):
            result = await self.func(**kwargs)
        else:
            result = await asyncio.to_thread(functools.partial(self.func, **kwargs))
            if inspect.isawaitable(result):
                result = await result
        return wrap_result(result)


class StreamingFunctionTool(FunctionTool):
    """A function tool whose arguments stream to the caller as the model writes them."""

    def __init__(
        self,
        func: Callable[..., Any] | FunctionTool,
        *,
        filters_name: list[str] | None = None,
        filters: list | None = None,
    ) -> None:
        if isinstance(func, FunctionTool):
            super().__init__(
                func.func, name=func.name, description=func.description,
                filters_name=filters_name or func.filters_name, filters=filters or func.filters,
            )
        else:
            super().__init__(func, filters_name=filters_name, filters=filters)

    @property
    def is_streaming(self) -> bool:
        return True
