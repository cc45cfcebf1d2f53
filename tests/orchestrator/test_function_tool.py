"""FunctionTool: schemas from type hints and docstrings, context injection, result wrapping, errors."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from orchestrator.context import InvocationContext
from orchestrator.errors import ToolError
from orchestrator.sessions import Session
from orchestrator.tools import FunctionTool, StreamingFunctionTool, get_tool, register_tool


class City(BaseModel):
    """City information."""

    city: str = Field(..., description="City name")


class Address(BaseModel):
    city: City = Field(..., description="City information")
    province: str = Field(..., description="Province name")


class PostalCodeInfo(BaseModel):
    city: str
    postal_code: str


def get_postal_code(addr: Address) -> PostalCodeInfo:
    """Get the postal code of an address.

    Args:
        addr: The address, with city and province.

    Returns:
        The postal code.
    """
    codes = {"Guangdong": {"Shenzhen": "518000"}}
    return PostalCodeInfo(city=addr.city.city, postal_code=codes.get(addr.province, {}).get(addr.city.city, "Unknown"))


async def calculate(operation: Literal["add", "divide"], a: float, b: float, tags: list[str] | None = None) -> float:
    """Do arithmetic.

    Args:
        operation: Which operation to run.
        a: The first number.
        b: The second number,
            which may span lines.
        tags: Labels.
    """
    return a + b if operation == "add" else a / b


def _ctx() -> InvocationContext:
    return InvocationContext(session=Session(app_name="app", user_id="u"), agent=None)


def test_schema_comes_from_type_hints_and_the_docstring():
    tool = FunctionTool(calculate)
    assert tool.name == "calculate"
    assert tool.description == "Do arithmetic."
    schema = tool.parameters_schema()
    assert schema["required"] == ["operation", "a", "b"]
    assert schema["properties"]["operation"] == {"type": "string", "enum": ["add", "divide"], "description": "Which operation to run."}
    assert schema["properties"]["a"]["type"] == "number"
    assert schema["properties"]["b"]["description"] == "The second number, which may span lines."
    assert schema["properties"]["tags"]["type"] == "array"
    assert schema["properties"]["tags"]["items"] == {"type": "string"}


def test_nested_pydantic_parameters_keep_their_field_descriptions():
    schema = FunctionTool(get_postal_code).parameters_schema()
    addr = schema["properties"]["addr"]
    assert addr["type"] == "object"
    assert addr["description"] == "The address, with city and province."
    assert addr["properties"]["province"]["description"] == "Province name"
    assert addr["properties"]["city"]["properties"]["city"]["description"] == "City name"
    assert "$ref" not in str(schema)


async def test_pydantic_arguments_are_validated_and_results_dumped():
    result = await FunctionTool(get_postal_code).run_async(
        tool_context=_ctx(), args={"addr": {"city": {"city": "Shenzhen"}, "province": "Guangdong"}}
    )
    assert result == {"city": "Shenzhen", "postal_code": "518000"}


async def test_non_dict_results_are_wrapped():
    result = await FunctionTool(calculate).run_async(tool_context=_ctx(), args={"operation": "add", "a": 1, "b": 2})
    assert result == {"result": 3.0}


async def test_bad_arguments_become_an_error_result_not_an_exception():
    tool = FunctionTool(calculate)
    missing = await tool.run_async(tool_context=_ctx(), args={"operation": "add", "a": 1})
    assert missing == {"error": "invalid arguments for calculate: missing required argument: b"}
    wrong = await tool.run_async(tool_context=_ctx(), args={"operation": "pow", "a": 1, "b": 2, "zzz": 1})
    assert "unexpected argument(s): zzz" in wrong["error"]
    assert "operation" in wrong["error"]


async def test_tool_context_is_injected_and_hidden_from_the_schema():
    async def get_session_info(tool_context: InvocationContext) -> dict:
        """Session info."""
        return {"session_id": tool_context.session.id, "user_id": tool_context.session.user_id}

    tool = FunctionTool(get_session_info)
    assert tool.parameters_schema() == {"type": "object", "properties": {}}
    ctx = _ctx()
    assert await tool.run_async(tool_context=ctx, args={}) == {"session_id": ctx.session.id, "user_id": "u"}


def test_register_tool_and_get_tool():
    @register_tool("test_registry_echo")
    def echo(text: str) -> str:
        """Echo text."""
        return text

    tool = get_tool("test_registry_echo")
    assert isinstance(tool, FunctionTool) and tool.func is echo
    assert echo("x") == "x"
    assert get_tool("never_registered") is None
    with pytest.raises(ToolError, match="already registered"):
        @register_tool("test_registry_echo")
        def other(text: str) -> str:
            return text


def test_streaming_function_tool_is_streaming_and_function_tool_is_not():
    def write_file(path: str, content: str) -> dict:
        """Write a file."""
        return {"path": path, "size": len(content)}

    regular = FunctionTool(write_file)
    assert regular.is_streaming is False
    assert StreamingFunctionTool(write_file).is_streaming is True
    converted = StreamingFunctionTool(regular)
    assert converted.is_streaming is True and converted.name == "write_file"


def test_a_parameter_type_without_a_schema_is_a_clear_error():
    def bad(x: object) -> None:
        """Bad."""

    with pytest.raises(ToolError, match="no JSON schema"):
        FunctionTool(bad)
