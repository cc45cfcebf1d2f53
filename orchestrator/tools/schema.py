"""JSON schemas for function parameters, from type hints and docstrings."""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from orchestrator.errors import ToolError

_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_SECTION_HEADER = re.compile(r"^\s*(Returns|Return|Raises|Yields|Example|Examples|Note|Notes)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


def split_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description without the Args section, {parameter: description})."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section = "text"
    current: str | None = None
    arg_indent: int | None = None
    for line in lines:
        if _ARGS_HEADER.match(line):
            section, current, arg_indent = "args", None, None
            continue
        if _SECTION_HEADER.match(line):
            section = "other"
            description.append(line)
            continue
        if section == "args":
            if not line.strip():
                current = None
                continue
            indent = len(line) - len(line.lstrip())
            match = _ARG_LINE.match(line)
            if match and (arg_indent is None or indent <= arg_indent):
                arg_indent = indent
                current = match.group(1).lstrip("*")
                params[current] = match.group(3).strip()
            elif current is not None:
                params[current] = f"{params[current]} {line.strip()}".strip()
            continue
        description.append(line)
    return "\n".join(description).strip(), params


def type_schema(annotation: Any) -> dict[str, Any]:
    """The JSON schema of one Python type."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        if len(options) == 1:
            return type_schema(options[0])
        return {"anyOf": [type_schema(a) for a in options]}
    if origin is typing.Literal:
        values = list(get_args(annotation))
        return {"type": _json_type(type(values[0])), "enum": values}
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple, set):
        items = get_args(annotation)
        schema: dict[str, Any] = {"type": "array"}
        if items and items[0] is not Ellipsis:
            schema["items"] = type_schema(items[0])
        return schema
    if origin is dict or annotation is dict:
        return {"type": "object"}
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return model_schema(annotation)
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        values = [m.value for m in annotation]
        return {"type": _json_type(type(values[0])), "enum": values}
    if annotation in (str, int, float, bool):
        return {"type": _json_type(annotation)}
    raise ToolError(f"no JSON schema for parameter type {annotation!r}")


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A pydantic model's schema with every ``$ref`` inlined (some endpoints do not follow references)."""
    raw = model.model_json_schema()
    defs = raw.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                target = dict(defs[node["$ref"].split("/")[-1]])
                extra = {k: v for k, v in node.items() if k != "$ref"}
                return inline({**target, **extra})
            return {k: inline(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(raw)


def _json_type(py: type) -> str:
    if issubclass(py, bool):
        return "boolean"
    if issubclass(py, int):
        return "integer"
    if issubclass(py, float):
        return "number"
    return "string"
