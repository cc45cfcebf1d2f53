"""How ``MCPToolset`` reaches an MCP server: one parameter class per transport of the ``mcp`` SDK.

* ``StdioConnectionParams``: a local server the toolset starts as a child process and talks to over its stdin and
  stdout (``McpStdioServerParameters`` says what to start: command, arguments, environment, folder);
* ``SseConnectionParams``: a remote server over HTTP with Server-Sent Events (the older HTTP transport);
* ``StreamableHTTPConnectionParams``: a remote server over streamable HTTP (the current HTTP transport).

``timeout`` (seconds, default 5) bounds connecting, the ``initialize`` handshake and every request; a tool call may
be given a longer one by the toolset (``MCPToolset(call_timeout=...)``).
"""

from __future__ import annotations

import math
from typing import Any

from mcp import StdioServerParameters
from pydantic import BaseModel, ConfigDict, Field, field_validator

McpStdioServerParameters = StdioServerParameters
"""What to start for a stdio server: ``command``, ``args``, ``env`` (``None``: a minimal safe environment), ``cwd``."""

DEFAULT_TIMEOUT = 5.0


class _Timed(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    timeout: float = Field(DEFAULT_TIMEOUT, gt=0, description="seconds for connecting and for each request")

    @field_validator("timeout", "sse_read_timeout", check_fields=False)
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number of seconds")
        return value


class StdioConnectionParams(_Timed):
    """A server started as a child process, spoken to over its stdin and stdout."""

    server_params: StdioServerParameters

    def describe(self) -> str:
        return " ".join([self.server_params.command, *self.server_params.args])


class _Http(_Timed):
    url: str
    headers: dict[str, Any] | None = None
    sse_read_timeout: float = Field(300.0, gt=0, description="seconds to wait for the next event of a stream")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"an MCP server URL starts with http:// or https:// (got {value!r})")
        return value

    def describe(self) -> str:
        return self.url


class SseConnectionParams(_Http):
    """A remote server over HTTP and Server-Sent Events (``.../sse``)."""


class StreamableHTTPConnectionParams(_Http):
    """A remote server over streamable HTTP (``.../mcp``). ``terminate_on_close`` ends the server's session (an HTTP
    DELETE) when the toolset closes."""

    terminate_on_close: bool = True


ConnectionParams = StdioConnectionParams | SseConnectionParams | StreamableHTTPConnectionParams


def connection_params_of(value: Any) -> ConnectionParams:
    """``value`` as connection parameters: bare ``McpStdioServerParameters`` become ``StdioConnectionParams`` with
    the default timeout, as the guide allows."""
    if isinstance(value, StdioServerParameters):
        return StdioConnectionParams(server_params=value)
    if isinstance(value, (StdioConnectionParams, SseConnectionParams, StreamableHTTPConnectionParams)):
        return value
    raise TypeError(
        "MCPToolset needs connection_params: StdioConnectionParams, SseConnectionParams, "
        f"StreamableHTTPConnectionParams or McpStdioServerParameters (got {type(value).__name__})"
    )
