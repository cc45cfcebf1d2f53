"""LlmAgent and Runner against a scripted OpenAI-compatible server, through the real openai client."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from orchestrator.agents import LlmAgent
from orchestrator.context import InvocationContext
from orchestrator.models import LlmResponse, constants, openai_model
from orchestrator.runners import Runner
from orchestrator.sessions import InMemorySessionService
from orchestrator.tools import AgentTool, BaseTool, BaseToolSet, FunctionTool, StreamingFunctionTool
from orchestrator.types import Content, Part
from tests.orchestrator.conftest import declared_tools, tool_messages


async def _run(agent, text: str, *, session_service=None, session_id: str = "s1"):
    runner = Runner(app_name="test", agent=agent, session_service=session_service or InMemorySessionService())
    events = [e async for e in runner.run_async(user_id="u", session_id=session_id, new_message=Content(parts=[Part.from_text(text)]))]
    return runner, events


def get_weather(city: str) -> dict:
    """Get the weather of a city.

    Args:
        city: The city.
    """
    return {"city": city, "temperature": "15°C"}


async def test_a_tool_call_round_trip_streams_text_and_ends_with_the_answer(model_server, model):
    model_server.add(
        {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Beijing"}}]},
        {"text": "It is 15°C in Beijing.", "usage": {"prompt_tokens": 30, "completion_tokens": 8}},
    )
    agent = LlmAgent(name="weather", model=model, instruction="Be brief.", tools=[FunctionTool(get_weather)])
    runner, events = await _run(agent, "Weather in Beijing?")
    first, second = model_server.requests
    assert first["stream"] is True
    assert declared_tools(first) == ["get_weather"]
    assert first["messages"][0] == {"role": "system", "content": "Be brief."}
    assert first["messages"][1] == {"role": "user", "content": "Weather in Beijing?"}
    assert tool_messages(second)[0]["content"] == json.dumps({"city": "Beijing", "temperature": "15°C"}, ensure_ascii=False)
    partial_text = "".join(p.text for e in events if e.partial for p in e.content.parts if p.text)
    assert partial_text == "It is 15°C in Beijing."
    final = [e for e in events if e.is_final_response()]
    assert final[-1].content.text == "It is 15°C in Beijing."
    assert final[-1].usage.prompt_tokens == 30
    stored = await runner.session_service.get_session(app_name="test", user_id="u", session_id="s1")
    assert [e.author for e in stored.events] == ["user", "weather", "weather", "weather"]
    assert not any(e.partial for e in stored.events)


async def test_non_streaming_mode_and_reasoning_become_thought_parts(model_server, model):
    model_server.add({"text": "42", "reasoning": "think think"})
    agent = LlmAgent(name="a", model=model, stream=False)
    _, events = await _run(agent, "q")
    assert model_server.requests[0].get("stream") in (None, False)
    (answer,) = [e for e in events if e.is_final_response()]
    assert [(p.text, p.thought) for p in answer.content.parts] == [("think think", True), ("42", False)]


async def test_streamed_reasoning_arrives_as_partial_thought_events(model_server, model):
    model_server.add({"text": "ok", "reasoning": "step one, step two"})
    _, events = await _run(LlmAgent(name="a", model=model), "q")
    thoughts = "".join(p.text for e in events if e.partial for p in e.content.parts if p.thought)
    assert thoughts == "step one, step two"


async def test_malformed_tool_arguments_get_an_error_result_and_the_loop_goes_on(model_server, model):
    model_server.add(
        {"tool_calls": [{"name": "get_weather", "arguments": '{"city": "Bei'}]},
        {"text": "Sorry, let me retry."},
    )
    _, events = await _run(LlmAgent(name="a", model=model, tools=[get_weather]), "q")
    (response,) = tool_messages(model_server.requests[1])
    assert "were not a JSON object" in json.loads(response["content"])["error"]
    assert events[-1].content.text == "Sorry, let me retry."


async def test_a_call_to_an_unknown_tool_is_answered_with_an_error(model_server, model):
    model_server.add({"tool_calls": [{"name": "launch_rockets", "arguments": {}}]}, {"text": "done"})
    await _run(LlmAgent(name="a", model=model, tools=[get_weather]), "q")
    error = json.loads(tool_messages(model_server.requests[1])[0]["content"])["error"]
    assert error == "unknown tool 'launch_rockets'; available tools: get_weather"


async def test_a_tool_that_raises_becomes_an_error_result(model_server, model):
    def explode(reason: str) -> dict:
        """Fail."""
        raise RuntimeError(f"boom: {reason}")

    model_server.add({"tool_calls": [{"name": "explode", "arguments": {"reason": "test"}}]}, {"text": "it failed"})
    _, events = await _run(LlmAgent(name="a", model=model, tools=[explode]), "q")
    error = json.loads(tool_messages(model_server.requests[1])[0]["content"])["error"]
    assert error == "tool explode failed: RuntimeError: boom: test"
    assert events[-1].content.text == "it failed"


async def test_a_500_from_the_endpoint_is_retried_and_the_run_recovers(model_server, model):
    model_server.add({"status": 500}, {"status": 503}, {"text": "recovered"})
    _, events = await _run(LlmAgent(name="a", model=model), "q")
    assert len(model_server.requests) == 3
    assert events[-1].content.text == "recovered"


async def test_an_endpoint_that_keeps_failing_ends_with_a_clear_error_event(model_server, model):
    model_server.add(*[{"status": 500}] * 5)
    _, events = await _run(LlmAgent(name="a", model=model), "q")
    assert events[-1].error_code == "model_error"
    assert "after 4 attempt(s)" in events[-1].error_message
    assert "500" in events[-1].error_message


@pytest.fixture
def slept(monkeypatch) -> list[float]:
    """The pauses the model takes between attempts (taken as no pause at all)."""
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(openai_model, "asyncio", SimpleNamespace(sleep=sleep))
    return pauses


async def test_a_429_is_retried_after_the_pause_its_retry_after_asks(model_server, model, slept):
    model_server.add({"status": 429, "headers": {"Retry-After": "7"}}, {"status": 503}, {"text": "recovered"})
    _, events = await _run(LlmAgent(name="a", model=model), "q")
    assert events[-1].content.text == "recovered"
    assert slept == [7.0, model.retry_backoff * 2]  # the asked pause, then the backoff's own


async def test_a_retry_after_longer_than_a_minute_fails_the_call_with_what_was_asked(model_server, model, slept):
    model_server.add({"status": 429, "headers": {"Retry-After": "3600"}}, {"text": "never"})
    _, events = await _run(LlmAgent(name="a", model=model), "q")
    assert len(model_server.requests) == 1 and slept == []
    assert events[-1].error_code == "model_error" and "retry after 3600 s" in events[-1].error_message


async def test_a_401_is_not_retried(model_server, model):
    model_server.add({"status": 401, "text": "bad key"}, {"text": "never"})
    _, events = await _run(LlmAgent(name="a", model=model), "q")
    assert len(model_server.requests) == 1
    assert "refused the request" in events[-1].error_message


async def test_a_model_that_never_stops_calling_tools_is_stopped_after_max_steps(model_server, model):
    model_server.add(*[lambda body: {"tool_calls": [{"name": "get_weather", "arguments": {"city": "X"}}]}] * 10)
    _, events = await _run(LlmAgent(name="a", model=model, tools=[get_weather], max_steps=3), "q")
    assert len(model_server.requests) == 3
    assert events[-1].error_code == "max_steps"
    assert "stopped after 3 model calls" in events[-1].error_message


async def test_only_streaming_tools_produce_argument_delta_events(model_server, model):
    def write_file(path: str, content: str) -> dict:
        """Write a file."""
        return {"success": True, "path": path, "size": len(content)}

    def get_file_info(path: str) -> dict:
        """Info."""
        return {"path": path, "exists": True}

    content = "print('hello world')\n" * 5
    model_server.add(
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "hello.py", "content": content}},
                        {"name": "get_file_info", "arguments": {"path": "hello.py"}}]},
        {"text": "written"},
    )
    agent = LlmAgent(name="a", model=model, tools=[StreamingFunctionTool(write_file), FunctionTool(get_file_info)])
    _, events = await _run(agent, "write it")
    deltas = [e for e in events if e.is_streaming_tool_call()]
    assert deltas and {e.content.parts[0].function_call.name for e in deltas} == {"write_file"}
    streamed = "".join(e.content.parts[0].function_call.args[constants.TOOL_STREAMING_ARGS] for e in deltas)
    assert json.loads(streamed) == {"path": "hello.py", "content": content}
    assert constants.TOOL_STREAMING_ARGS == "tool_streaming_args"


async def test_parallel_tool_calls_run_concurrently(model_server, model):
    both_started = asyncio.Barrier(2)

    async def slow_a() -> str:
        """A."""
        await asyncio.wait_for(both_started.wait(), 5)
        return "a"

    async def slow_b() -> str:
        """B."""
        await asyncio.wait_for(both_started.wait(), 5)
        return "b"

    model_server.add({"tool_calls": [{"name": "slow_a", "arguments": {}}, {"name": "slow_b", "arguments": {}}]}, {"text": "ok"})
    await _run(LlmAgent(name="a", model=model, tools=[slow_a, slow_b]), "q")
    results = [json.loads(m["content"]) for m in tool_messages(model_server.requests[1])]
    assert results == [{"result": "a"}, {"result": "b"}]
    assert model_server.requests[0]["parallel_tool_calls"] is True


async def test_state_delta_is_on_tool_events_and_temp_keys_are_not_persisted(model_server, model):
    def remember(tool_context: InvocationContext) -> str:
        """Remember."""
        tool_context.actions.state_delta["user_type"] = "vip"
        tool_context.actions.state_delta["temp:scratch"] = "only now"
        return "ok"

    def peek(tool_context: InvocationContext) -> dict:
        """Peek."""
        return {"scratch": tool_context.state.get("temp:scratch"), "user_type": tool_context.state.get("user_type")}

    model_server.add(
        {"tool_calls": [{"name": "remember", "arguments": {}}]},
        {"tool_calls": [{"name": "peek", "arguments": {}}]},
        {"text": "done"},
        {"tool_calls": [{"name": "peek", "arguments": {}}]},
        {"text": "done again"},
    )
    service = InMemorySessionService()
    agent = LlmAgent(name="a", model=model, tools=[remember, peek])
    _, events = await _run(agent, "first", session_service=service)
    tool_event = next(e for e in events if e.function_responses() and e.function_responses()[0].name == "remember")
    assert tool_event.actions.state_delta == {"user_type": "vip", "temp:scratch": "only now"}
    assert json.loads(tool_messages(model_server.requests[2])[-1]["content"]) == {"scratch": "only now", "user_type": "vip"}
    session = await service.get_session(app_name="test", user_id="u", session_id="s1")
    assert session.state == {"user_type": "vip"}
    assert all("temp:scratch" not in e.actions.state_delta for e in session.events)
    await _run(agent, "second", session_service=service)
    assert json.loads(tool_messages(model_server.requests[4])[-1]["content"]) == {"scratch": None, "user_type": "vip"}


async def test_toolset_chooses_tools_from_session_state(model_server, model):
    class WeatherToolSet(BaseToolSet):
        def __init__(self):
            super().__init__()
            self.name = "weather_toolset"
            self.tools = []

        def initialize(self) -> None:
            super().initialize()
            self.tools = [FunctionTool(self.get_current_weather), FunctionTool(self.get_weather_forecast)]

        async def get_tools(self, invocation_context=None):
            if not invocation_context:
                return self.tools[:1]
            if invocation_context.session.state.get("user_type", "basic") == "vip":
                return self.tools
            return self.tools[:1]

        async def get_current_weather(self, city: str) -> dict:
            """Current weather."""
            return {"city": city}

        async def get_weather_forecast(self, city: str, days: int = 3) -> dict:
            """Forecast."""
            return {"city": city, "days": days}

    toolset = WeatherToolSet()
    toolset.initialize()
    service = InMemorySessionService()
    await service.create_session(app_name="test", user_id="u", session_id="vip", state={"user_type": "vip"})
    model_server.add({"text": "hi"}, {"text": "hi"})
    agent = LlmAgent(name="a", model=model, tools=[toolset])
    await _run(agent, "q", session_service=service, session_id="basic")
    await _run(agent, "q", session_service=service, session_id="vip")
    assert declared_tools(model_server.requests[0]) == ["get_current_weather"]
    assert declared_tools(model_server.requests[1]) == ["get_current_weather", "get_weather_forecast"]


async def test_agent_tool_runs_the_wrapped_agent_and_skip_summarization_ends_the_turn(model_server, model):
    translator = LlmAgent(name="translator", model=model, description="Translates text.", instruction="Translate to French.")
    model_server.add(
        {"tool_calls": [{"name": "translator", "arguments": {"request": "hello"}}]},
        {"text": "bonjour"},
        {"text": "The translation is bonjour."},
    )
    main = LlmAgent(name="main", model=model, tools=[AgentTool(agent=translator)])
    _, events = await _run(main, "translate hello")
    assert model_server.requests[1]["messages"][0] == {"role": "system", "content": "Translate to French."}
    assert json.loads(tool_messages(model_server.requests[2])[0]["content"]) == {"result": "bonjour"}
    assert events[-1].content.text == "The translation is bonjour."

    model_server.add({"tool_calls": [{"name": "translator", "arguments": {"request": "cat"}}]}, {"text": "chat"})
    main = LlmAgent(name="main", model=model, tools=[AgentTool(agent=translator, skip_summarization=True)])
    before = len(model_server.requests)
    _, events = await _run(main, "translate cat")
    assert len(model_server.requests) == before + 2  # no summarizing call after the tool
    assert events[-1].actions.skip_summarization is True
    assert events[-1].function_responses()[0].response == {"result": "chat"}


async def test_callbacks_can_watch_and_replace_model_and_tool_steps(model_server, model):
    seen = []

    def before_model(ctx, request):
        seen.append(("before_model", len(request.contents)))

    async def after_model(ctx, response):
        seen.append(("after_model", response.content.text))

    def before_tool(tool, args, ctx):
        seen.append(("before_tool", tool.name, args))
        return {"city": args["city"], "temperature": "cached"} if args["city"] == "Paris" else None

    def after_tool(tool, args, ctx, result):
        seen.append(("after_tool", result["temperature"]))
        return {**result, "checked": True}

    model_server.add({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}, {"text": "fine"})
    agent = LlmAgent(
        name="a", model=model, tools=[get_weather], before_model_callback=before_model, after_model_callback=after_model,
        before_tool_callback=before_tool, after_tool_callback=after_tool,
    )
    await _run(agent, "q")
    assert seen == [
        ("before_model", 1), ("after_model", ""), ("before_tool", "get_weather", {"city": "Paris"}),
        ("after_tool", "cached"), ("before_model", 3), ("after_model", "fine"),
    ]
    assert json.loads(tool_messages(model_server.requests[1])[0]["content"]) == {"city": "Paris", "temperature": "cached", "checked": True}


async def test_before_model_callback_can_answer_without_calling_the_model(model_server, model):
    def canned(ctx, request):
        return LlmResponse(content=Content(role="model", parts=[Part.from_text("canned")]))

    _, events = await _run(LlmAgent(name="a", model=model, before_model_callback=canned), "q")
    assert model_server.requests == []
    assert events[-1].content.text == "canned"


async def test_custom_base_tool_declares_its_own_schema(model_server, model):
    class Shout(BaseTool):
        def __init__(self):
            super().__init__(name="shout", description="Upper-case text.")

        def parameters_schema(self):
            return {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

        async def _run_async_impl(self, *, tool_context, args):
            return args["text"].upper()

    model_server.add({"tool_calls": [{"name": "shout", "arguments": {"text": "hey"}}]}, {"text": "ok"})
    await _run(LlmAgent(name="a", model=model, tools=[Shout()]), "q")
    body = model_server.requests[0]
    assert body["tools"][0]["function"]["parameters"]["required"] == ["text"]
    assert json.loads(tool_messages(model_server.requests[1])[0]["content"]) == {"result": "HEY"}
