"""The user guides' examples, written against ``orchestrator`` instead of ``trpc_agent_sdk``, run end to end.

Each test uses the imports, constructors and event-handling loop the guides show, against the scripted
OpenAI-compatible server (``OPENAI_BASE_URL`` points the string model names at it).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from typing_extensions import override

from orchestrator.agents import LlmAgent
from orchestrator.code_executors import create_local_workspace_runtime
from orchestrator.context import InvocationContext
from orchestrator.models import LLMModel, OpenAIModel
from orchestrator.models import constants as const
from orchestrator.runners import Runner
from orchestrator.sessions import InMemorySessionService
from orchestrator.skills import DynamicSkillToolSet, SkillToolSet, create_default_skill_repository
from orchestrator.skills.tools import LinkSkillStager
from orchestrator.tools import BaseTool, BaseToolSet, FunctionTool, StreamingFunctionTool, get_tool, register_tool
from orchestrator.types import Content, Part
from tests.orchestrator.weather_tools import ask_name_information

LIBRARY = Path(__file__).resolve().parents[2] / "skills"


@pytest.fixture(autouse=True)
def endpoint(model_server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", model_server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")


async def consume(runner: Runner, query: str) -> dict:
    """The guides' event loop: stream text, count streaming-tool deltas, note calls and results."""
    seen = {"text": "", "streamed_args": "", "calls": [], "results": [], "answers": []}
    session_id = str(uuid.uuid4())
    await runner.session_service.create_session(app_name=runner.app_name, user_id="demo_user", session_id=session_id)
    user_content = Content(parts=[Part.from_text(text=query)])
    async for event in runner.run_async(user_id="demo_user", session_id=session_id, new_message=user_content):
        if not event.content or not event.content.parts:
            continue
        if event.is_streaming_tool_call():
            for part in event.content.parts:
                if part.function_call:
                    seen["streamed_args"] += part.function_call.args.get(const.TOOL_STREAMING_ARGS, "")
            continue
        if event.partial:
            for part in event.content.parts:
                if part.text:
                    seen["text"] += part.text
            continue
        for part in event.content.parts:
            if part.thought:
                continue
            if part.function_call:
                seen["calls"].append(part.function_call.name)
            elif part.function_response:
                seen["results"].append(part.function_response.response)
            elif part.text:
                seen["answers"].append(part.text)
    await runner.close()
    return seen


async def get_weather(city: str) -> dict:
    """Get the weather of a city.

    Args:
        city: City name, such as "Beijing".
    """
    data = {"Beijing": {"temperature": "15°C", "condition": "Sunny"}}
    if city in data:
        return {"status": "success", "city": city, **data[city]}
    return {"status": "error", "error_message": f"no data for {city}", "supported_cities": list(data)}


async def test_function_tool_example(model_server):
    model_server.add({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Beijing"}}]}, {"text": "Sunny, 15°C."})
    weather_tool = FunctionTool(get_weather)
    agent = LlmAgent(
        name="function_tool_demo_agent", model="deepseek-chat",
        description="An assistant demonstrating FunctionTool usage", instruction="You answer weather questions.",
        tools=[weather_tool],
    )
    seen = await consume(Runner(app_name="function_tools", agent=agent, session_service=InMemorySessionService()), "Beijing?")
    assert model_server.requests[0]["model"] == "deepseek-chat"
    assert seen["calls"] == ["get_weather"]
    assert seen["results"][0]["condition"] == "Sunny"
    assert seen["answers"] == ["Sunny, 15°C."]


@register_tool("get_session_info")
async def get_session_info(tool_context: InvocationContext) -> dict:
    """Get the current session's information."""
    session = tool_context.session
    return {"status": "success", "session_id": session.id, "user_id": session.user_id, "app_name": session.app_name}


async def test_registered_tool_with_injected_context_example(model_server):
    model_server.add({"tool_calls": [{"name": "get_session_info", "arguments": {}}]}, {"text": "ok"})
    session_tool = get_tool("get_session_info")
    agent = LlmAgent(name="session_agent", model="deepseek-chat", tools=[session_tool])
    seen = await consume(Runner(app_name="registry_demo", agent=agent, session_service=InMemorySessionService()), "who am I?")
    assert seen["results"][0]["user_id"] == "demo_user"
    assert seen["results"][0]["app_name"] == "registry_demo"


def write_file(path: str, content: str) -> dict:
    """Write content to a file (streamed).

    Args:
        path: The file's path.
        content: What to write.
    """
    return {"success": True, "path": path, "size": len(content)}


def get_file_info(path: str) -> dict:
    """Get information about a file."""
    return {"path": path, "exists": True}


class CustomStreamingWriteTool(BaseTool):
    def __init__(self):
        super().__init__(name="custom_write", description="A custom streaming write tool")

    @property
    @override
    def is_streaming(self) -> bool:
        return True

    @override
    async def _run_async_impl(self, *, tool_context, args):
        return {"success": True}


class FileToolSet(BaseToolSet):
    def __init__(self):
        super().__init__(name="file_tools")
        self._tools = [StreamingFunctionTool(self._write_file), FunctionTool(self._get_file_info)]

    def _write_file(self, path: str, content: str) -> dict:
        """Write a file (streamed)."""
        return {"success": True, "path": path, "size": len(content)}

    def _get_file_info(self, path: str) -> dict:
        """File information (not streamed)."""
        return {"path": path, "exists": True}

    async def get_tools(self, invocation_context=None):
        return self._tools


async def test_streaming_tools_example(model_server):
    code = "def add(a, b):\n    return a + b\n"
    model_server.add(
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "hello.py", "content": code}}]},
        {"text": "Created hello.py."},
    )

    def _create_model() -> LLMModel:
        return OpenAIModel(model_name="demo-model", api_key="test-key", base_url=model_server.base_url)

    agent = LlmAgent(
        name="streaming_tool_demo_agent", description="An assistant demonstrating streaming tool usage",
        model=_create_model(), instruction="Write files when asked.",
        tools=[StreamingFunctionTool(write_file), FunctionTool(get_file_info)],
    )
    seen = await consume(Runner(app_name="streaming_tool_demo", agent=agent, session_service=InMemorySessionService()), "calc")
    assert '"content": "def add' in seen["streamed_args"]
    assert seen["results"] == [{"success": True, "path": "hello.py", "size": len(code)}]
    assert seen["text"] == "Created hello.py."
    assert StreamingFunctionTool(write_file).is_streaming and not FunctionTool(get_file_info).is_streaming
    assert StreamingFunctionTool(FunctionTool(write_file)).is_streaming
    assert CustomStreamingWriteTool().is_streaming


async def test_streaming_tools_inside_a_toolset_are_detected(model_server):
    model_server.add(
        {"tool_calls": [{"name": "_write_file", "arguments": {"path": "a.txt", "content": "hello"}},
                        {"name": "_get_file_info", "arguments": {"path": "a.txt"}}]},
        {"text": "done"},
    )
    agent = LlmAgent(name="toolset_streaming", model="demo-model", tools=[FileToolSet(), CustomStreamingWriteTool()])
    seen = await consume(Runner(app_name="t", agent=agent, session_service=InMemorySessionService()), "write")
    assert seen["streamed_args"] == '{"path": "a.txt", "content": "hello"}'
    assert len(seen["results"]) == 2


async def test_skills_example(model_server, work_root):
    model_server.add(
        {"tool_calls": [{"name": "skill_load", "arguments": {"skill_name": "user-file-ops"}}]},
        {"tool_calls": [{"name": "skill_run", "arguments": {
            "skill": "user-file-ops",
            "command": "printf 'hello from skillrun\\nthis is another line\\n' > work/inputs/user-notes.txt && "
                       "bash scripts/summarize_file.sh work/inputs/user-notes.txt out/user-notes-summary.txt",
            "output_files": ["out/user-notes-summary.txt"]}}]},
        {"text": "Summarized: 2 lines, 7 words."},
    )
    workspace_runtime = create_local_workspace_runtime(work_root=str(work_root))
    repository = create_default_skill_repository(str(LIBRARY), workspace_runtime=workspace_runtime, use_cached_repository=True)
    skill_tool_set = SkillToolSet(
        repository=repository, skill_stager=LinkSkillStager(),
        run_tool_kwargs={"save_as_artifacts": True, "omit_inline_content": False},
    )
    agent = LlmAgent(
        name="skill_run_agent", description="A professional skill run assistant that can use Agent Skills.",
        model="demo-model", instruction="Use skills.", tools=[skill_tool_set], skill_repository=repository,
    )
    seen = await consume(Runner(app_name="skills_demo", agent=agent, session_service=InMemorySessionService()), "summarize")
    assert seen["results"][0] == {"result": "skill 'user-file-ops' loaded"}
    run = seen["results"][1]
    assert run["exit_code"] == 0
    assert run["output_files"][0]["name"] == "out/user-notes-summary.txt"
    assert "Lines: 2" in run["output_files"][0]["content"]
    assert run["output_files"][0]["mime_type"] == "text/plain"
    assert run["artifact_files"][0]["name"] == "out/user-notes-summary.txt"
    await workspace_runtime.close()


async def test_dynamic_skills_example(model_server, work_root):
    model_server.add(
        {"tool_calls": [{"name": "skill_load", "arguments": {"skill_name": "weather-tools"}}]},
        {"tool_calls": [{"name": "get_current_weather", "arguments": {"city": "Beijing"}}]},
        {"text": "22°C and partly cloudy."},
    )
    skill_repository = create_default_skill_repository(str(LIBRARY), workspace_runtime=create_local_workspace_runtime(str(work_root)))
    available_tools = {"get_current_weather", "get_weather_forecast", "search_city_by_name", FunctionTool(ask_name_information)}
    dynamic_toolset = DynamicSkillToolSet(skill_repository=skill_repository, available_tools=available_tools)
    agent = LlmAgent(
        name="dynamic_skill_agent", model="demo-model", instruction="Use skills.",
        tools=[SkillToolSet(repository=skill_repository), dynamic_toolset], skill_repository=skill_repository,
    )
    seen = await consume(Runner(app_name="dynamic", agent=agent, session_service=InMemorySessionService()), "Beijing weather")
    before, after, _ = ({t["function"]["name"] for t in body.get("tools", [])} for body in model_server.requests)
    assert after - before == {"get_current_weather", "get_weather_forecast", "search_city_by_name"}
    assert "ask_name_information" not in after
    assert seen["results"][1]["condition"] == "Partly Cloudy"
    assert seen["answers"] == ["22°C and partly cloudy."]
