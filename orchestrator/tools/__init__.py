"""Tools: function tools, tool sets, the registry, agent tools, streaming tools."""

from orchestrator.tools.agent_tool import AgentTool
from orchestrator.tools.base import BaseTool
from orchestrator.tools.function_tool import FunctionTool, StreamingFunctionTool
from orchestrator.tools.registry import get_tool, register_tool
from orchestrator.tools.toolset import BaseToolSet

__all__ = ["AgentTool", "BaseTool", "BaseToolSet", "FunctionTool", "StreamingFunctionTool", "get_tool", "register_tool"]
