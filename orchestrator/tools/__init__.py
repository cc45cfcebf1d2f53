"""Tools: the framework (``base``, function and streaming tools, tool sets, the registry, agent tools, schemas from
signatures) and, in packages of their own, the tool families: ``mcp`` (MCP servers' tools), ``web`` (fetch and
search), ``planning`` (todo list, task board, session goal) and ``file_tools`` (a host folder or the session's
workspace).

Exports are imported on first use (``worker.lazy``): the MCP names load the ``mcp`` SDK, which takes most of a
second, and the web tools load httpx and an HTML parser, so agents without them do not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "orchestrator.tools.agent_tool": ["AgentTool"],
    "orchestrator.tools.base": ["BaseTool"],
    "orchestrator.tools.function_tool": ["FunctionTool", "StreamingFunctionTool"],
    "orchestrator.tools.registry": ["get_tool", "register_tool"],
    "orchestrator.tools.toolset": ["BaseToolSet"],
    "orchestrator.tools.mcp": ["MCPTool", "MCPToolset", "McpStdioServerParameters", "SseConnectionParams",
                               "StdioConnectionParams", "StreamableHTTPConnectionParams"],
    "orchestrator.tools.web": ["FetchResult", "SearchHit", "WebFetchTool", "WebSearchResult", "WebSearchTool"],
    "orchestrator.tools.planning": ["GoalToolSet", "TaskToolSet", "TodoWriteTool", "get_task_store", "get_todos",
                                    "render_task_list", "render_todos"],
    "orchestrator.tools.file_tools": ["BashTool", "EditTool", "FileToolSet", "GlobTool", "GrepTool", "ReadTool",
                                      "WorkspaceFileToolSet", "WriteTool"],
})

if TYPE_CHECKING:
    from orchestrator.tools.agent_tool import AgentTool
    from orchestrator.tools.base import BaseTool
    from orchestrator.tools.file_tools import (BashTool, EditTool, FileToolSet, GlobTool, GrepTool, ReadTool,
                                               WorkspaceFileToolSet, WriteTool)
    from orchestrator.tools.function_tool import FunctionTool, StreamingFunctionTool
    from orchestrator.tools.mcp import (MCPTool, MCPToolset, McpStdioServerParameters, SseConnectionParams,
                                        StdioConnectionParams, StreamableHTTPConnectionParams)
    from orchestrator.tools.planning import (GoalToolSet, TaskToolSet, TodoWriteTool, get_task_store, get_todos,
                                             render_task_list, render_todos)
    from orchestrator.tools.registry import get_tool, register_tool
    from orchestrator.tools.toolset import BaseToolSet
    from orchestrator.tools.web import FetchResult, SearchHit, WebFetchTool, WebSearchResult, WebSearchTool
