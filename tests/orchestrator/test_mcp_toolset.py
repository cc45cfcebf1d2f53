"""``MCPToolset`` against real MCP servers (``tests/mcp_servers.py``, started as processes) over stdio, SSE and
streamable HTTP, driven through ``LlmAgent`` and ``Runner`` by the scripted model: what the model is offered, what it
reads back, and what happens when servers fail, hang, crash, restart or declare nonsense.

Timeouts are kept short (1-5 s). No test asserts how long something took: a timeout test asserts that the call
returned an error result naming the timeout. No server process outlives its test (checked after each test and at
the end of the module).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import logging
import uuid
from datetime import timedelta
from typing import Any

import pytest
from mcp import ClientSession, McpError
from mcp.client.stdio import stdio_client

from orchestrator.agents import LlmAgent
from orchestrator.errors import McpConnectionError, ToolError
from orchestrator.events import Event
from orchestrator.runners import Runner
from orchestrator.sessions import InMemorySessionService
from orchestrator.tools import (
    FunctionTool,
    McpStdioServerParameters,
    MCPTool,
    MCPToolset,
    SseConnectionParams,
    StdioConnectionParams,
    StreamableHTTPConnectionParams,
)
from orchestrator.types import Content, Part
from tests.mcp_servers import PNG, WEATHER, McpHttpServer, free_port, our_servers, stdio_command, wait_until
from tests.orchestrator.conftest import declared_tools, tool_messages
from tests.processes import alive, running_with, wait_gone, wait_none_with

TRANSPORTS = ["stdio", "sse", "streamable-http"]
HTTP_TRANSPORTS = ["sse", "streamable-http"]
GUIDE_TOOLS = ["get_weather", "calculate"]


# -- fixtures and helpers ------------------------------------------------------------------------------------------


class SharedServers:
    """One FastMCP server per HTTP transport, started on first use, for the tests that neither kill it nor change
    its tool list."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack
        self.servers: dict[str, McpHttpServer] = {}

    def __call__(self, transport: str) -> McpHttpServer:
        if transport not in self.servers:
            self.servers[transport] = self._stack.enter_context(McpHttpServer(transport))
        return self.servers[transport]

    def pids(self) -> set[int]:
        return {server.pid for server in self.servers.values()}


@pytest.fixture(scope="module")
def shared_http():
    with contextlib.ExitStack() as stack:
        yield SharedServers(stack)
    assert wait_until(lambda: not our_servers()), f"MCP server processes left running: {our_servers()}"


@pytest.fixture(autouse=True)
def no_server_left_behind(shared_http):
    """After each test, every server process it started is gone (the module's shared HTTP servers excepted)."""
    yield
    left = lambda: {pid: mode for pid, mode in our_servers().items() if pid not in shared_http.pids()}  # noqa: E731
    assert wait_until(lambda: not left()), f"MCP server processes left running after the test: {left()}"


def stdio_params(mode: str = "stdio", *extra: str, timeout: float = 5.0) -> StdioConnectionParams:
    command, args = stdio_command(mode, *extra)
    return StdioConnectionParams(server_params=McpStdioServerParameters(command=command, args=args), timeout=timeout)


def http_params(transport: str, url: str, timeout: float = 5.0) -> SseConnectionParams | StreamableHTTPConnectionParams:
    if transport == "sse":
        return SseConnectionParams(url=url, timeout=timeout)
    return StreamableHTTPConnectionParams(url=url, timeout=timeout)


@pytest.fixture
async def toolsets():
    """Makes ``MCPToolset``s and closes them all at the end of the test."""
    made: list[MCPToolset] = []

    def make(params: Any, **kwargs: Any) -> MCPToolset:
        toolset = MCPToolset(params, **kwargs)
        made.append(toolset)
        return toolset

    yield make
    for toolset in made:
        await toolset.close()


@pytest.fixture
def toolset_for(shared_http, toolsets):
    """``toolset_for(transport, **kwargs)``: a toolset on a new stdio server, or on the module's HTTP server."""

    def make(transport: str, *, timeout: float = 5.0, **kwargs: Any) -> MCPToolset:
        if transport == "stdio":
            return toolsets(stdio_params(timeout=timeout), **kwargs)
        return toolsets(http_params(transport, shared_http(transport).url, timeout), **kwargs)

    return make


class Chat:
    """One conversation with ``agent`` through a ``Runner`` (closed, with the agent's tool sets, by ``close``)."""

    def __init__(self, agent: LlmAgent) -> None:
        self.runner = Runner(app_name="mcp-tests", agent=agent, session_service=InMemorySessionService())
        self.session_id = uuid.uuid4().hex

    async def say(self, text: str = "go", user_id: str = "u") -> list[Event]:
        message = Content(parts=[Part.from_text(text)])
        return [e async for e in self.runner.run_async(user_id=user_id, session_id=self.session_id, new_message=message)
                if not e.partial]

    async def close(self) -> None:
        await self.runner.close()


@pytest.fixture
async def chat():
    """``chat(agent)``: a ``Chat``, closed at the end of the test."""
    chats: list[Chat] = []

    def make(agent: LlmAgent) -> Chat:
        chats.append(Chat(agent))
        return chats[-1]

    yield make
    for one in chats:
        await one.close()


def results(body: dict) -> list[dict]:
    """The tool results (JSON objects) new in the request ``body``: the answers to the model's latest calls."""
    trailing: list[dict] = []
    for message in reversed(body["messages"]):
        if message["role"] != "tool":
            break
        trailing.insert(0, json.loads(message["content"]))
    return trailing


def last_results(model_server) -> list[dict]:
    """The tool results of the model's latest request (the answers to the calls it made just before)."""
    return results(model_server.requests[-1])


def call(name: str, **arguments: Any) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def answer(events: list[Event]) -> str | None:
    return events[-1].content.text if events and events[-1].content else None


_reference: list[dict] = []


async def reference_tools() -> list[dict]:
    """The test server's tool list as the SDK's own client reads it over stdio (no orchestrator code involved)."""
    if not _reference:
        command, args = stdio_command()
        async with stdio_client(McpStdioServerParameters(command=command, args=args)) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
        _reference.extend(tool.model_dump(mode="json") for tool in listed.tools)
    return _reference


# -- what the model is offered -------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_model_is_offered_every_tool_with_the_schema_the_server_declares(
        transport, toolset_for, chat, model_server, model):
    model_server.add({"text": "hello"})
    agent = LlmAgent(name="mcp", model=model, tools=[toolset_for(transport)])
    events = await chat(agent).say()
    assert answer(events) == "hello"
    reference = await reference_tools()
    offered = {t["function"]["name"]: t["function"] for t in model_server.requests[0]["tools"]}
    assert list(offered) == [tool["name"] for tool in reference]
    for tool in reference:
        assert offered[tool["name"]]["parameters"] == tool["inputSchema"], tool["name"]
        assert offered[tool["name"]]["description"] == tool["description"], tool["name"]
    assert offered["calculate"]["parameters"]["required"] == ["operation", "a", "b"]
    assert offered["calculate"]["parameters"]["properties"]["a"]["type"] == "number"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_list_of_names_chooses_the_tools(transport, toolset_for, chat, model_server, model):
    model_server.add({"text": "ok"})
    agent = LlmAgent(name="mcp", model=model, tools=[toolset_for(transport, tool_filter=["calculate", "get_weather"])])
    await chat(agent).say()
    assert declared_tools(model_server.requests[0]) == GUIDE_TOOLS  # in the server's order, not the filter's


async def test_a_predicate_chooses_the_tools_and_may_look_at_the_invocation(toolset_for, chat, model_server, model):
    seen: list[tuple[type, str | None]] = []

    def by_user(tool, ctx) -> bool:
        seen.append((type(tool), ctx.session.user_id if ctx is not None else None))
        return tool.name in GUIDE_TOOLS or ctx.session.user_id == "admin"

    model_server.add({"text": "guest"}, {"text": "admin"}, {"text": "tool only"})
    # The filter does not depend on the transport: the module's streamable HTTP server saves starting processes.
    by_user_tools = toolset_for("streamable-http", tool_filter=by_user)
    await chat(LlmAgent(name="mcp", model=model, tools=[by_user_tools])).say(user_id="guest")
    await chat(LlmAgent(name="mcp", model=model, tools=[by_user_tools])).say(user_id="admin")
    one_arg = toolset_for("streamable-http", tool_filter=lambda tool: tool.name.startswith("get_"))
    await chat(LlmAgent(name="mcp", model=model, tools=[one_arg])).say()
    guest, admin, single = model_server.requests
    assert declared_tools(guest) == GUIDE_TOOLS
    assert set(GUIDE_TOOLS + ["fail", "slow", "crash", "whoami"]) <= set(declared_tools(admin))
    assert declared_tools(single) == ["get_weather"]
    assert {kind for kind, _ in seen} == {MCPTool}
    assert {user for _, user in seen} == {"guest", "admin"}


async def test_a_subclass_may_set_the_connection_and_the_filter_after_init(chat, model_server, model):
    class WeatherOnly(MCPToolset):
        def __init__(self) -> None:
            super().__init__()
            self._connection_params = stdio_params()
            self._tool_filter = ["get_weather"]

    model_server.add(call("get_weather", location="Shenzhen"), {"text": "rainy"})
    events = await chat(LlmAgent(name="mcp", model=model, tools=[WeatherOnly()])).say()
    assert declared_tools(model_server.requests[0]) == ["get_weather"]
    assert last_results(model_server)[0]["result"] == WEATHER["Shenzhen"]
    assert answer(events) == "rainy"


async def test_bare_stdio_server_parameters_are_accepted(toolsets):
    command, args = stdio_command()
    toolset = toolsets(McpStdioServerParameters(command=command, args=args))
    assert [t.name for t in await toolset.get_tools()][:2] == GUIDE_TOOLS
    assert (await toolset.call_tool("get_weather", {"location": "Beijing"}))["result"] == WEATHER["Beijing"]


# -- calls and what the model reads back ---------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_calls_with_arguments_reach_the_server_and_the_model_reads_the_results(
        transport, toolset_for, chat, model_server, model):
    marker = uuid.uuid4().hex
    model_server.add(
        {"tool_calls": [{"name": "calculate", "arguments": {"operation": "multiply", "a": 6, "b": 7.5}},
                        {"name": "get_weather", "arguments": {"location": marker}}]},
        call("call_log"),
        {"text": "45 and no data"},
    )
    events = await chat(LlmAgent(name="mcp", model=model, tools=[toolset_for(transport)])).say()
    calculated, weather = results(model_server.requests[1])
    assert calculated == {"result": "45.0", "structured_content": {"result": 45.0}}
    assert weather["result"] == f"Weather data for {marker} is not available"
    (log,) = last_results(model_server)
    assert {"tool": "get_weather", "args": {"location": marker}} in log["structured_content"]["result"]
    assert answer(events) == "45 and no data"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_is_error_result_is_an_error_the_model_reads_and_the_turn_goes_on(
        transport, toolset_for, chat, model_server, model):
    model_server.add(call("fail", reason="disk full"), {"text": "the tool failed"})
    events = await chat(LlmAgent(name="mcp", model=model, tools=[toolset_for(transport)])).say()
    (result,) = last_results(model_server)
    assert set(result) == {"error"}
    assert "the tool failed on purpose: disk full" in result["error"]
    assert answer(events) == "the tool failed"
    assert not any(e.error_code for e in events)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_images_and_embedded_resources_are_described_not_inlined(
        transport, toolset_for, chat, model_server, model):
    model_server.add(call("picture"), {"text": "a chart and a table"})
    await chat(LlmAgent(name="mcp", model=model, tools=[toolset_for(transport)])).say()
    message = tool_messages(model_server.requests[-1])[-1]
    result = json.loads(message["content"])
    assert result["result"] == "Here is the chart."
    assert result["content"] == [
        {"type": "text", "text": "Here is the chart."},
        {"type": "image", "mime_type": "image/png", "size_bytes": len(PNG)},
        {"type": "resource", "uri": "file:///reports/q3.csv", "mime_type": "text/csv", "text": "month,sales\nJuly,12\n"},
    ]
    assert base64.b64encode(PNG).decode() not in message["content"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_structured_content_reaches_the_model(transport, toolset_for, chat, model_server, model):
    model_server.add(call("forecast", city="Oslo"), {"text": "sunny first"})
    await chat(LlmAgent(name="mcp", model=model, tools=[toolset_for(transport)])).say()
    (result,) = last_results(model_server)
    expected = {"city": "Oslo", "days": ["sunny", "cloudy", "rain"], "high_c": 21}
    assert result["structured_content"] == expected
    assert json.loads(result["result"]) == expected  # FastMCP's text block: the same object as JSON


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_arguments_the_schema_rejects_are_an_error_result_and_are_not_sent(
        transport, toolset_for, chat, model_server, model):
    marker = uuid.uuid4().hex
    model_server.add(
        call("calculate", operation=marker, a="ten"),
        call("call_log"),
        {"text": "bad arguments"},
    )
    events = await chat(LlmAgent(name="mcp", model=model, tools=[toolset_for(transport)])).say()
    (rejected,) = results(model_server.requests[1])
    assert rejected["error"].startswith("invalid arguments for calculate: ")
    assert "a: 'ten' is not of type 'number'" in rejected["error"]
    assert "'b' is a required property" in rejected["error"]
    (log,) = last_results(model_server)
    assert not [c for c in log["structured_content"]["result"] if c["args"].get("operation") == marker]
    assert answer(events) == "bad arguments"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_tool_slower_than_call_timeout_is_an_error_result_and_the_turn_goes_on(
        transport, toolset_for, chat, model_server, model):
    model_server.add(call("slow"), call("get_weather", location="Beijing"), {"text": "gave up on slow"})
    toolset = toolset_for(transport, call_timeout=1)
    events = await chat(LlmAgent(name="mcp", model=model, tools=[toolset])).say()
    (timed_out,) = results(model_server.requests[1])
    assert timed_out == {"error": "slow did not answer within 1 s (the call's timeout)"}
    (weather,) = results(model_server.requests[2])  # the connection still serves the next call
    assert weather["result"] == WEATHER["Beijing"]
    assert answer(events) == "gave up on slow"
    assert toolset.connection.connects == 1


# -- a changing tool list ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_tool_list_is_fetched_again_after_the_server_announces_a_change(
        transport, toolsets, chat, model_server, model):
    with contextlib.ExitStack() as stack:  # a server of this test's own: grow changes its tool list for good
        if transport == "stdio":
            params = stdio_params()
        else:
            params = http_params(transport, stack.enter_context(McpHttpServer(transport)).url)
        toolset = toolsets(params)
        # Over streamable HTTP, a notification not related to a request travels on the session's GET stream and
        # may reach the client after the call's answer; related to the call it comes first, as over stdio and SSE.
        grow = call("grow", on_request_stream=True) if transport == "streamable-http" else call("grow")
        model_server.add(grow, call("late_tool", word="late"), {"text": "LATE"})
        conversation = chat(LlmAgent(name="mcp", model=model, tools=[toolset]))
        events = await conversation.say()
        await conversation.close()
    first, second, third = model_server.requests
    assert "late_tool" not in declared_tools(first)
    assert declared_tools(second)[-1] == "late_tool"
    assert results(third) == [{"result": "LATE", "structured_content": {"result": "LATE"}}]
    assert answer(events) == "LATE"
    assert toolset.connection.connects == 1  # refreshed on the same session


# -- failing, crashing and restarting servers ----------------------------------------------------------------------


async def test_a_stdio_server_that_crashes_during_a_call_is_started_again_on_the_next_call(
        toolsets, chat, model_server, model):
    toolset = toolsets(stdio_params(), call_timeout=2)
    model_server.add(call("whoami"), call("crash"), call("whoami"), {"text": "recovered"})
    events = await chat(LlmAgent(name="mcp", model=model, tools=[toolset])).say()
    (before,) = results(model_server.requests[1])
    (crashed,) = results(model_server.requests[2])
    (after,) = results(model_server.requests[3])
    assert crashed["error"].startswith("crash: the MCP server ")
    assert "closed the connection during the request" in crashed["error"]
    assert "error" not in after
    first_pid, second_pid = int(before["result"]), int(after["result"])
    assert first_pid != second_pid
    assert wait_gone(first_pid)
    assert alive(second_pid)
    assert toolset.connection.connects == 2
    assert answer(events) == "recovered"
    assert declared_tools(model_server.requests[3]) == declared_tools(model_server.requests[0])


async def test_a_request_waiting_when_the_stdio_server_dies_fails_with_connection_closed_not_a_timeout(toolsets):
    # The SDK's session fails the requests still waiting when the stream ends; a request that instead waited out
    # its read timeout would carry the SDK's 408 "Timed out while waiting" as its cause.
    toolset = toolsets(stdio_params())
    await toolset.get_tools()
    with pytest.raises(McpConnectionError, match="closed the connection during the request") as caught:
        await toolset.connection.request(
            lambda session: session.call_tool("crash", {}, read_timeout_seconds=timedelta(seconds=2)))
    cause = caught.value.__cause__
    assert isinstance(cause, McpError)
    assert cause.error.message == "Connection closed", cause.error.message


@pytest.mark.parametrize("transport", HTTP_TRANSPORTS)
async def test_a_request_to_an_http_server_that_went_down_fails_at_once_not_by_its_timeout(transport, toolsets):
    with McpHttpServer(transport) as server:
        toolset = toolsets(http_params(transport, server.url))
        await toolset.get_tools()
        await asyncio.to_thread(server.kill)
        with pytest.raises(McpConnectionError) as caught:
            await toolset.connection.request(
                lambda session: session.call_tool("whoami", {}, read_timeout_seconds=timedelta(seconds=2)))
    cause = caught.value.__cause__
    assert server.url in str(caught.value)
    assert not (isinstance(cause, McpError) and cause.error.code == 408), f"the request timed out: {cause}"


@pytest.mark.parametrize("transport", HTTP_TRANSPORTS)
async def test_an_http_server_killed_and_restarted_on_the_same_port_serves_the_next_call(
        transport, toolsets, chat, model_server, model):
    with McpHttpServer(transport) as server:
        toolset = toolsets(http_params(transport, server.url), call_timeout=2)
        conversation = chat(LlmAgent(name="mcp", model=model, tools=[toolset]))
        model_server.add(call("whoami"), {"text": "one"})
        await conversation.say()
        first_pid = server.pid
        await asyncio.to_thread(server.restart)
        assert server.pid != first_pid
        model_server.add(call("whoami"), {"text": "two"}, call("get_weather", location="Beijing"), {"text": "three"})
        second = await conversation.say()
        third = await conversation.say()
        await conversation.close()
    assert results(model_server.requests[1]) == [{"result": str(first_pid), "structured_content": {"result": first_pid}}]
    restarted = results(model_server.requests[3])[0]
    assert restarted.get("result") == str(server.pid), restarted
    assert results(model_server.requests[5])[0].get("result") == WEATHER["Beijing"]
    assert [answer(second), answer(third)] == ["two", "three"]
    assert toolset.connection.connects == 2


@pytest.mark.parametrize("transport", HTTP_TRANSPORTS)
async def test_a_call_while_the_http_server_is_down_is_a_clear_error_and_the_call_after_its_restart_works(
        transport, toolsets, chat, model_server, model):
    with McpHttpServer(transport) as server:
        toolset = toolsets(http_params(transport, server.url), call_timeout=2)
        conversation = chat(LlmAgent(name="mcp", model=model, tools=[toolset]))
        model_server.add(call("whoami"), {"text": "up"})
        await conversation.say()
        await asyncio.to_thread(server.kill)
        model_server.add(call("whoami"), {"text": "down"})
        down = await conversation.say()
        await asyncio.to_thread(server.start)
        model_server.add(call("whoami"), {"text": "up again"})
        up_again = await conversation.say()
        await conversation.close()
    (failed,) = results(model_server.requests[3])
    assert failed["error"].startswith("whoami: ")
    assert server.url in failed["error"]
    assert ("cannot connect" in failed["error"] and "ConnectError" in failed["error"]) or \
        "closed the connection" in failed["error"], failed
    assert answer(down) == "down"
    assert results(model_server.requests[5]) == [{"result": str(server.pid), "structured_content": {"result": server.pid}}]
    assert answer(up_again) == "up again"


# -- servers that cannot be used -----------------------------------------------------------------------------------


async def test_a_server_that_never_answers_initialize_fails_within_the_timeout_and_is_stopped(
        toolsets, chat, model_server, model):
    token = uuid.uuid4().hex
    toolset = toolsets(stdio_params("silent", token, timeout=1))
    events = await chat(LlmAgent(name="mcp", model=model, tools=[toolset])).say()
    (event,) = [e for e in events if e.author == "mcp"]
    assert event.error_code == "tools_unavailable"
    assert "did not complete the initialize handshake within 1 s" in event.error_message
    assert token in event.error_message  # the command is named
    assert model_server.requests == []
    assert wait_none_with(token), f"the silent server is still running: {running_with(token)}"
    with pytest.raises(McpConnectionError, match="initialize handshake within 1 s"):
        await toolset.get_tools()
    assert wait_none_with(token), f"the silent server is still running: {running_with(token)}"


async def test_a_handshake_timeout_leaves_no_unretrieved_future_behind(caplog):
    toolset = MCPToolset(stdio_params("silent", uuid.uuid4().hex, timeout=0.5))
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        try:
            await toolset.get_tools()
        except McpConnectionError:
            pass
        else:
            pytest.fail("the handshake with a silent server succeeded")
        await toolset.close()
        del toolset
        gc.collect()
    unretrieved = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert not unretrieved


async def test_a_stdio_command_that_does_not_exist_is_a_clear_error(toolsets, chat, model_server, model):
    missing = f"/nonexistent/mcp-server-{uuid.uuid4().hex[:8]}"
    toolset = toolsets(StdioConnectionParams(server_params=McpStdioServerParameters(command=missing), timeout=2))
    events = await chat(LlmAgent(name="mcp", model=model, tools=[toolset])).say()
    assert events[-1].error_code == "tools_unavailable"
    assert f"cannot connect to the MCP server {missing}" in events[-1].error_message
    assert "No such file or directory" in events[-1].error_message
    assert model_server.requests == []


@pytest.mark.parametrize("transport", HTTP_TRANSPORTS)
async def test_a_url_that_refuses_connections_is_a_clear_error(transport, toolsets, chat, model_server, model):
    url = f"http://127.0.0.1:{free_port()}/{'sse' if transport == 'sse' else 'mcp'}"
    toolset = toolsets(http_params(transport, url, timeout=2))
    events = await chat(LlmAgent(name="mcp", model=model, tools=[toolset])).say()
    assert events[-1].error_code == "tools_unavailable"
    assert f"cannot connect to the MCP server {url}" in events[-1].error_message
    assert "ConnectError" in events[-1].error_message
    with pytest.raises(McpConnectionError, match="cannot connect"):
        await toolset.get_tools()
    assert model_server.requests == []


async def test_a_server_that_answers_the_tool_list_with_an_error_is_an_error_event(toolsets, chat, model_server, model):
    toolset = toolsets(stdio_params("unlistable", timeout=3))
    events = await chat(LlmAgent(name="mcp", model=model, tools=[toolset])).say()
    assert events[-1].error_code == "tools_unavailable"
    assert "answered tools/list with an error: the tool registry is unavailable" in events[-1].error_message
    assert "mcp_servers.py unlistable" in events[-1].error_message  # the server is named
    assert model_server.requests == []


async def test_a_tool_with_a_malformed_schema_is_skipped_with_a_warning_and_the_others_work(
        toolsets, chat, model_server, model, caplog):
    model_server.add(call("echo", text="hi"), {"text": "echoed"})
    toolset = toolsets(stdio_params("malformed"))
    with caplog.at_level(logging.WARNING, logger="orchestrator.tools.mcp.toolset"):
        events = await chat(LlmAgent(name="mcp", model=model, tools=[toolset])).say()
    assert declared_tools(model_server.requests[0]) == ["echo"]
    assert last_results(model_server) == [{"result": "echo: hi"}]
    assert answer(events) == "echoed"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'broken_properties' skipped" in w and "malformed" in w for w in warnings), warnings
    assert any("'string_input' skipped" in w and "'object'" in w for w in warnings), warnings


# -- names -----------------------------------------------------------------------------------------------------------


def current_time() -> str:
    """The local clock."""
    return "09:30"


async def test_an_mcp_tool_named_like_a_function_tool_is_a_tools_unavailable_event(toolset_for, chat, model_server, model):
    agent = LlmAgent(name="mcp", model=model, tools=[FunctionTool(current_time), toolset_for("sse")])
    events = await chat(agent).say()
    assert events[-1].error_code == "tools_unavailable"
    assert "'current_time'" in events[-1].error_message
    assert "FunctionTool" in events[-1].error_message and "MCPTool" in events[-1].error_message
    assert model_server.requests == []


async def test_leaving_the_colliding_mcp_tool_out_with_the_filter_resolves_the_collision(
        toolset_for, chat, model_server, model):
    model_server.add(call("current_time"), {"text": "half past nine"})
    toolset = toolset_for("sse", tool_filter=lambda tool: tool.name != "current_time")
    events = await chat(LlmAgent(name="mcp", model=model, tools=[current_time, toolset])).say()
    assert declared_tools(model_server.requests[0]).count("current_time") == 1
    assert last_results(model_server) == [{"result": "09:30"}]  # the function tool answered
    assert answer(events) == "half past nine"


def test_two_plain_tools_with_one_name_are_refused_when_the_agent_is_made(model):
    with pytest.raises(ToolError, match="'current_time'"):
        LlmAgent(name="mcp", model=model, tools=[current_time, FunctionTool(current_time)])


# -- closing -------------------------------------------------------------------------------------------------------


async def test_closing_the_runner_stops_the_stdio_server_and_a_later_call_starts_a_new_one(
        toolsets, chat, model_server, model):
    toolset = toolsets(stdio_params())
    model_server.add(call("whoami"), {"text": "done"})
    conversation = chat(LlmAgent(name="mcp", model=model, tools=[toolset]))
    await conversation.say()
    pid = int(last_results(model_server)[0]["result"])
    assert alive(pid)
    await conversation.close()  # Runner.close -> LlmAgent.close -> MCPToolset.close
    assert wait_gone(pid), f"the stdio server {pid} is still running after close()"
    again = await toolset.call_tool("whoami", {})
    assert int(again["result"]) != pid
    await toolset.close()
    assert wait_gone(int(again["result"]))
