"""Tools: function tools, tool sets, the registry, agent tools, streaming tools, MCP servers' tools, web fetch and
search, file tools (host folder or the session's workspace).

The MCP names (``MCPToolset``, ``MCPTool`` and the connection parameters) load the ``mcp`` SDK, which takes most of
a second to import, and the web tools load httpx and an HTML parser; they are imported on first use, so agents
without them do not pay for it.
"""

from importlib import import_module
from typing import Any

from orchestrator.tools.agent_tool import AgentTool
from orchestrator.tools.base import BaseTool
from orchestrator.tools.function_tool import FunctionTool, StreamingFunctionTool
from orchestrator.tools.registry import get_tool, register_tool
from orchestrator.tools.toolset import BaseToolSet

_LAZY_NAMES = {
    "MCPTool": "orchestrator.tools.mcp_toolset",
    "MCPToolset": "orchestrator.tools.mcp_toolset",
    "McpStdioServerParameters": "orchestrator.tools.mcp_params",
    "SseConnectionParams": "orchestrator.tools.mcp_params",
    "StdioConnectionParams": "orchestrator.tools.mcp_params",
    "StreamableHTTPConnectionParams": "orchestrator.tools.mcp_params",
    "FetchResult": "orchestrator.tools.web_fetch",
    "WebFetchTool": "orchestrator.tools.web_fetch",
    "SearchHit": "orchestrator.tools.web_search",
    "WebSearchResult": "orchestrator.tools.web_search",
    "WebSearchTool": "orchestrator.tools.web_search",
    "TodoWriteTool": "orchestrator.tools.todo",
    "get_todos": "orchestrator.tools.todo",
    "render_todos": "orchestrator.tools.todo",
    "TaskToolSet": "orchestrator.tools.tasks",
    "get_task_store": "orchestrator.tools.tasks",
    "render_task_list": "orchestrator.tools.tasks",
    "GoalToolSet": "orchestrator.tools.goal_tools",
    "FileToolSet": "orchestrator.tools.file_tools",
    "ReadTool": "orchestrator.tools.file_tools",
    "WriteTool": "orchestrator.tools.file_tools",
    "EditTool": "orchestrator.tools.file_tools",
    "GrepTool": "orchestrator.tools.file_tools",
    "BashTool": "orchestrator.tools.file_tools",
    "GlobTool": "orchestrator.tools.file_tools",
    "WorkspaceFileToolSet": "orchestrator.tools.file_tools",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY_NAMES:
        return getattr(import_module(_LAZY_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AgentTool",
    "BaseTool",
    "BaseToolSet",
    "BashTool",
    "EditTool",
    "FetchResult",
    "FileToolSet",
    "FunctionTool",
    "GlobTool",
    "GoalToolSet",
    "GrepTool",
    "MCPTool",
    "MCPToolset",
    "McpStdioServerParameters",
    "ReadTool",
    "SearchHit",
    "SseConnectionParams",
    "StdioConnectionParams",
    "StreamableHTTPConnectionParams",
    "StreamingFunctionTool",
    "TaskToolSet",
    "TodoWriteTool",
    "WebFetchTool",
    "WebSearchResult",
    "WebSearchTool",
    "WorkspaceFileToolSet",
    "WriteTool",
    "get_task_store",
    "get_todos",
    "get_tool",
    "register_tool",
    "render_task_list",
    "render_todos",
]
