"""MCP servers for the ``MCPToolset`` tests, and helpers that run them as real processes.

Run as a script, it is a server:

* ``python tests/mcp_servers.py stdio`` — the FastMCP test server over stdin and stdout;
* ``python tests/mcp_servers.py sse PORT`` / ``streamable-http PORT`` — the same server over HTTP on 127.0.0.1:PORT
  (``/sse`` and ``/mcp``);
* ``python tests/mcp_servers.py malformed`` — a low-level ``Server`` (stdio) declaring tools with malformed input
  schemas beside a good one;
* ``python tests/mcp_servers.py unlistable`` — a low-level ``Server`` (stdio) that answers ``tools/list`` with an
  error;
* ``python tests/mcp_servers.py silent [TOKEN]`` — a process that reads its stdin and never answers (not even
  ``initialize``); ``TOKEN`` only makes its command line unique, so a test can find the process.

The FastMCP server has the guide's ``get_weather`` and ``calculate`` and tools that misbehave on purpose: ``fail``
(an ``isError`` result), ``slow`` (sleeps), ``crash`` (the process exits at once), ``picture`` (an image and an
embedded resource), ``forecast`` (structured output), ``grow`` (adds ``late_tool`` and announces
``notifications/tools/list_changed``), ``current_time`` (a name the tests also give a function tool), ``whoami``
(the server's pid) and ``call_log`` (the calls this process received, to show a call was never sent).

Imported, it gives ``McpHttpServer``: the FastMCP server over SSE or streamable HTTP as a subprocess on a free
loopback port, waited for until it accepts connections, killed (and restartable on the same port) by the test.
"""

import asyncio
import base64
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
WEATHER = {
    "Beijing": "Sunny, 15°C, humidity 45%",
    "Shanghai": "Cloudy, 18°C, humidity 65%",
    "Shenzhen": "Light rain, 25°C, humidity 80%",
}
# A 1x1 transparent PNG (67 bytes).
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
SLOW_TOOL_SECONDS = 30.0


# -- the servers ---------------------------------------------------------------------------------------------------


def fastmcp_server(port: int = 8000) -> Any:
    # Annotations are evaluated where the tools are defined (no ``from __future__ import annotations`` here):
    # FastMCP reads them to build the tools' schemas.
    from mcp import types
    from mcp.server.fastmcp import Context, FastMCP, Image
    from typing_extensions import TypedDict

    class RecordingFastMCP(FastMCP):
        """Notes every ``tools/call`` request as it arrives, before FastMCP checks its arguments."""

        async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
            received.append({"tool": name, "args": arguments})
            return await super().call_tool(name, arguments)

    received: list[dict[str, Any]] = []
    app = RecordingFastMCP("simple-tools", host="127.0.0.1", port=port, log_level="WARNING")

    @app.tool()
    async def get_weather(location: str) -> str:
        """Get the weather of a place.

        Args:
            location: the place's name
        """
        return WEATHER.get(location, f"Weather data for {location} is not available")

    @app.tool()
    async def calculate(operation: str, a: float, b: float) -> float:
        """Do basic arithmetic.

        Args:
            operation: add, subtract, multiply or divide
            a: the first number
            b: the second number
        """
        operations = {
            "add": lambda x, y: x + y,
            "subtract": lambda x, y: x - y,
            "multiply": lambda x, y: x * y,
            "divide": lambda x, y: x / y if y != 0 else float("inf"),
        }
        if operation not in operations:
            raise ValueError(f"Unsupported operation: {operation}")
        return operations[operation](a, b)

    @app.tool()
    async def fail(reason: str) -> str:
        """Always fails: the server answers with an isError result."""
        raise ValueError(f"the tool failed on purpose: {reason}")

    @app.tool()
    async def slow(seconds: float = SLOW_TOOL_SECONDS) -> str:
        """Sleeps, then answers."""
        await asyncio.sleep(seconds)
        return f"slept {seconds} s"

    @app.tool()
    async def crash() -> str:
        """Ends the server's process at once, without answering."""
        os._exit(3)

    @app.tool(structured_output=False)
    async def picture() -> list[Any]:
        """An image and an embedded text resource."""
        return [
            "Here is the chart.",
            Image(data=PNG, format="png"),
            types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                uri="file:///reports/q3.csv", mimeType="text/csv", text="month,sales\nJuly,12\n")),
        ]

    class Forecast(TypedDict):
        city: str
        days: list[str]
        high_c: int

    @app.tool()
    async def forecast(city: str) -> Forecast:
        """A three-day forecast as structured content."""
        return {"city": city, "days": ["sunny", "cloudy", "rain"], "high_c": 21}

    @app.tool()
    async def grow(ctx: Context, on_request_stream: bool = False) -> str:
        """Adds the tool late_tool and tells the client the tool list changed: with the session's
        ``send_tool_list_changed()`` (over streamable HTTP it travels on the session's GET stream, so it may reach
        the client after this call's answer), or, with ``on_request_stream``, as a notification related to this
        request (over streamable HTTP it then comes on the call's own stream, before the answer)."""

        async def late_tool(word: str) -> str:
            """A tool added while the server runs."""
            return word.upper()

        app.add_tool(late_tool)
        if on_request_stream:
            await ctx.session.send_notification(
                types.ServerNotification(types.ToolListChangedNotification()), related_request_id=ctx.request_id)
        else:
            await ctx.session.send_tool_list_changed()
        return "late_tool added"

    @app.tool()
    async def current_time() -> str:
        """The server's clock (the tests give a function tool the same name)."""
        return "12:00"

    @app.tool()
    async def whoami() -> int:
        """The server's process id."""
        return os.getpid()

    @app.tool()
    async def call_log() -> list[dict[str, Any]]:
        """The ``tools/call`` requests this server process received (name and arguments), in order."""
        return received

    return app


def malformed_server() -> Any:
    """A low-level server whose tool list holds two tools a model cannot be given, beside a good one."""
    from mcp import types
    from mcp.server.lowlevel import Server

    server: Server = Server("malformed")
    tools = [
        types.Tool(name="broken_properties", description="properties is not an object",
                   inputSchema={"type": "object", "properties": 5}),
        types.Tool(name="string_input", description="a schema that is not an object's",
                   inputSchema={"type": "string"}),
        types.Tool(name="echo", description="Echoes its text.",
                   inputSchema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
    ]

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return tools

    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict[str, Any]) -> list[types.TextContent]:
        if name != "echo":
            raise ValueError(f"{name} cannot be called")
        return [types.TextContent(type="text", text=f"echo: {arguments['text']}")]

    return server


def unlistable_server() -> Any:
    """A low-level server that completes the handshake and answers every ``tools/list`` with an error."""
    from mcp import types
    from mcp.server.lowlevel import Server

    server: Server = Server("unlistable")

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        raise RuntimeError("the tool registry is unavailable")

    return server


async def _run_lowlevel_stdio(server: Any) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def _silent() -> None:
    """Read whatever the client writes and never answer; stop when stdin closes."""
    for _ in sys.stdin:
        pass


def main(argv: list[str]) -> None:
    mode = argv[0] if argv else "stdio"
    if mode == "malformed":
        asyncio.run(_run_lowlevel_stdio(malformed_server()))
    elif mode == "unlistable":
        asyncio.run(_run_lowlevel_stdio(unlistable_server()))
    elif mode == "silent":
        _silent()
    elif mode in ("stdio", "sse", "streamable-http"):
        port = int(argv[1]) if len(argv) > 1 else 8000
        fastmcp_server(port).run(transport=mode)
    else:
        raise SystemExit(
            f"unknown mode {mode!r}: stdio | sse PORT | streamable-http PORT | malformed | unlistable | silent")


# -- helpers for the tests -----------------------------------------------------------------------------------------


def stdio_command(mode: str = "stdio", *extra: str) -> tuple[str, list[str]]:
    """The command and arguments that start this script's server ``mode`` over stdio."""
    return sys.executable, [str(SCRIPT), mode, *extra]


def our_servers() -> dict[int, str]:
    """This script's server processes started by this process (its children, stdio and HTTP): pid -> mode.
    Processes of other test runs on the machine are not counted."""
    me, found = os.getpid(), {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
        except OSError:
            continue
        state, parent = fields[0], int(fields[1])
        if parent == me and state != "Z" and str(SCRIPT) in argv:
            where = argv.index(str(SCRIPT))
            found[int(entry.name)] = argv[where + 1] if len(argv) > where + 1 else "stdio"
    return found


def wait_until(condition: Any, seconds: float = 5.0) -> bool:
    """Whether ``condition()`` holds within ``seconds`` (looked at every 20 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class McpHttpServer:
    """This script's FastMCP server over ``transport`` (``sse`` or ``streamable-http``) as a subprocess on a free
    loopback port. ``start()`` returns once the port accepts connections; ``kill()`` SIGKILLs the process (as a
    crash would); ``restart()`` starts it again on the same port; ``stop()`` (and leaving the ``with``) ends it."""

    START_SECONDS = 20.0

    def __init__(self, transport: str) -> None:
        if transport not in ("sse", "streamable-http"):
            raise ValueError(f"an HTTP transport is sse or streamable-http, not {transport!r}")
        self.transport = transport
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{'sse' if self.transport == 'sse' else 'mcp'}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the server is not running"
        return self.proc.pid

    def start(self) -> "McpHttpServer":
        assert self.proc is None or self.proc.poll() is not None, "the server is already running"
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), self.transport, str(self.port)],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + self.START_SECONDS
        while not accepts_connections(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the MCP {self.transport} server on port {self.port} exited with {self.proc.returncode} before "
                    f"it accepted connections:\n{self.output()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"the MCP {self.transport} server did not accept connections on port {self.port} within "
                    f"{self.START_SECONDS:g} s:\n{self.output()}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        """SIGKILL the server and wait until it is gone (its port is then closed)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def restart(self) -> "McpHttpServer":
        self.kill()
        return self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def __enter__(self) -> "McpHttpServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.close()


if __name__ == "__main__":
    main(sys.argv[1:])
