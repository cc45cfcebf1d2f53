"""The MCP tool family: ``MCPToolset`` (an MCP server's tools as an agent's), its connection parameters, its
reconnecting session and how a tool result reads. Exports are imported on first use (``worker.lazy``): the ``mcp``
SDK takes most of a second to load."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "orchestrator.tools.mcp.params": ["ConnectionParams", "McpStdioServerParameters", "SseConnectionParams",
                                      "StdioConnectionParams", "StreamableHTTPConnectionParams"],
    "orchestrator.tools.mcp.toolset": ["MCPTool", "MCPToolset"],
})

if TYPE_CHECKING:
    from orchestrator.tools.mcp.params import (ConnectionParams, McpStdioServerParameters, SseConnectionParams,
                                               StdioConnectionParams, StreamableHTTPConnectionParams)
    from orchestrator.tools.mcp.toolset import MCPTool, MCPToolset
