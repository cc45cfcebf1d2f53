"""Skillrun as an MCP server: a team's skill library, with every run in Skillrun's sandboxes, for any MCP client.

``SkillMcpServer`` (``server``) serves the skill tools and skill resources for a caller's scope; ``serve_stdio``
(``stdio``) serves one library over stdin and stdout (``skillrun mcp``); the API serves it at ``/mcp`` behind the
team's key (``orchestrator.api.mcp``). ``Conversation`` (``conversation``) is what one MCP session keeps.
"""

from orchestrator.mcp_server.conversation import Conversation, Scope
from orchestrator.mcp_server.server import McpCaps, SkillMcpServer
from orchestrator.mcp_server.stdio import serve_stdio

__all__ = ["Conversation", "McpCaps", "Scope", "SkillMcpServer", "serve_stdio"]
