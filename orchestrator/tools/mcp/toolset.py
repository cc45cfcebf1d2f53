"""``MCPToolset``: the tools of an MCP server as tools of an agent.

Give it ``connection_params`` (``StdioConnectionParams``, ``SseConnectionParams``, ``StreamableHTTPConnectionParams``
or bare ``McpStdioServerParameters``) and optionally a ``tool_filter`` — tool names, or a predicate called with each
``MCPTool`` (and the invocation context, if it takes two arguments). Both may also be set as ``_connection_params``
and ``_tool_filter`` in a subclass's ``__init__`` after ``super().__init__()``, as the guide does.

The server's tool list is fetched once and kept; it is fetched again when the server announces a change
(``notifications/tools/list_changed``) or after a reconnection. A tool whose declaration a model cannot use (an input
schema that is not a valid JSON schema of an object, a name outside ``[A-Za-z0-9_-]{1,64}``) is skipped with a
warning; the others still work. Arguments are checked against the tool's schema before they are sent. A call that
fails — a server that cannot be reached or crashed, a timeout, the server's own error — is an error result the model
reads, and the agent's turn goes on; the next call starts or reaches the server again.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import jsonschema
from mcp import McpError, types

from orchestrator.context import InvocationContext
from orchestrator.errors import McpConnectionError, ToolError
from orchestrator.tools.base import BaseTool
from orchestrator.tools.mcp.params import ConnectionParams, connection_params_of
from orchestrator.tools.mcp.results import tool_result
from orchestrator.tools.mcp.session import McpConnection
from orchestrator.tools.toolset import BaseToolSet

logger = logging.getLogger(__name__)

MODEL_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TIMED_OUT = 408  # the SDK's error code for a request that got no answer in time
ToolFilter = list[str] | Callable[..., bool]


class MCPTool(BaseTool):
    """One tool of an MCP server; its schema reaches the model as the server declares it."""

    def __init__(self, toolset: "MCPToolset", tool: types.Tool) -> None:
        super().__init__(name=tool.name, description=tool.description or tool.title or "")
        self.mcp_tool = tool
        self._toolset = toolset
        self._validator = jsonschema.validators.validator_for(tool.inputSchema)(tool.inputSchema)

    def parameters_schema(self) -> dict[str, Any]:
        return self.mcp_tool.inputSchema

    async def _run_async_impl(self, *, tool_context: InvocationContext, args: dict[str, Any]) -> Any:
        problems = sorted(self._validator.iter_errors(args), key=lambda e: list(e.absolute_path))
        if problems:
            where = lambda e: ".".join(map(str, e.absolute_path)) or "arguments"  # noqa: E731
            return {"error": f"invalid arguments for {self.name}: "
                             + "; ".join(f"{where(e)}: {e.message}" for e in problems[:5])}
        return await self._toolset.call_tool(self.name, args)


class MCPToolset(BaseToolSet):
    """The tools of one MCP server (see the module docstring)."""

    def __init__(
        self,
        connection_params: ConnectionParams | Any = None,
        tool_filter: ToolFilter | None = None,
        *,
        call_timeout: float | None = None,
        name: str = "",
        filters_name: list[str] | None = None,
    ) -> None:
        super().__init__(name=name, filters_name=filters_name)
        self._connection_params = connection_params
        self._tool_filter = tool_filter
        self._call_timeout = call_timeout
        self._connection: McpConnection | None = None
        self._tools: list[MCPTool] | None = None
        self._listed_on = 0
        self._stale = False
        self._listing = asyncio.Lock()

    @property
    def connection(self) -> McpConnection:
        """The connection to the server, made from ``_connection_params`` on first use."""
        if self._connection is None:
            self._connection = McpConnection(connection_params_of(self._connection_params), self._tools_changed)
        return self._connection

    async def get_tools(self, invocation_context: InvocationContext | None = None) -> list[BaseTool]:
        """The server's tools that pass the filter. The first listing's failure is raised (``McpConnectionError``,
        or ``ToolError`` when the server answers it with an error); a later one leaves the tools listed before, whose
        calls then report the error."""
        connection = self.connection
        if self._tools is None or self._stale or connection.connects != self._listed_on:
            async with self._listing:
                if self._tools is None or self._stale or connection.connects != self._listed_on:
                    try:
                        await self._list(connection)
                    except (McpConnectionError, McpError) as exc:
                        if self._tools is not None:
                            logger.warning("MCP toolset %s: listing tools failed (%s); keeping the last list",
                                           self.name, exc)
                        elif isinstance(exc, McpError):
                            raise ToolError(f"the MCP server {connection.params.describe()} answered tools/list with "
                                            f"an error: {exc.error.message}") from exc
                        else:
                            raise
        return [tool for tool in self._tools or [] if self._passes(tool, invocation_context)]

    async def call_tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Call the server's tool ``name``; every failure is an error result."""
        connection = self.connection
        timeout = self._call_timeout or connection.params.timeout
        try:
            async with asyncio.timeout(timeout + connection.params.timeout):
                result = await connection.request(
                    lambda session: session.call_tool(name, args, read_timeout_seconds=timedelta(seconds=timeout)))
        except McpConnectionError as exc:
            return {"error": f"{name}: {exc}"}
        except McpError as exc:
            if exc.error.code == TIMED_OUT:
                return {"error": f"{name} did not answer within {timeout:g} s (the call's timeout)"}
            return {"error": f"the MCP server refused the call to {name}: {exc.error.message}"}
        except TimeoutError:
            await connection.close()  # something under the SDK stopped answering: start over on the next call
            return {"error": f"{name} did not answer within {timeout:g} s (the call's timeout)"}
        except RuntimeError as exc:  # the SDK's check of structured content against the tool's output schema
            return {"error": f"{name} answered with content its own output schema refuses: {exc}"}
        return tool_result(result)

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()

    def _tools_changed(self) -> None:
        self._stale = True

    async def _list(self, connection: McpConnection) -> None:
        self._stale = False
        listed: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await connection.request(lambda session: session.list_tools(cursor=cursor))
            listed.extend(page.tools)
            cursor = page.nextCursor
            if not cursor:
                break
        self._listed_on = connection.connects
        self._tools = [tool for tool in (self._usable(t) for t in listed) if tool is not None]

    def _usable(self, tool: types.Tool) -> MCPTool | None:
        where = f"MCP server {self.connection.params.describe()}"
        if not MODEL_TOOL_NAME.fullmatch(tool.name):
            logger.warning("%s: tool %r skipped: a model's tool name is 1-64 letters, digits, '_' or '-'", where,
                           tool.name)
            return None
        schema = tool.inputSchema
        try:
            if not isinstance(schema, dict) or schema.get("type") != "object":
                raise jsonschema.SchemaError("the input schema must be a JSON schema of type 'object'")
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            logger.warning("%s: tool %r skipped: its input schema is malformed: %s", where, tool.name, exc.message)
            return None
        return MCPTool(self, tool)

    def _passes(self, tool: MCPTool, context: InvocationContext | None) -> bool:
        chosen = self._tool_filter
        if chosen is None:
            return True
        if not callable(chosen):
            return tool.name in chosen
        takes_context = len(inspect.signature(chosen).parameters) >= 2
        return bool(chosen(tool, context) if takes_context else chosen(tool))
