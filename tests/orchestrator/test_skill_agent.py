"""Skills in the agent loop: three-tier injection, the seven skill tools, DynamicSkillToolSet, skill_run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.agents import LlmAgent
from orchestrator.runners import Runner
from orchestrator.sessions import InMemorySessionService
from orchestrator.skills import DynamicSkillToolSet, SkillToolSet, create_default_skill_repository
from orchestrator.skills.tools import LinkSkillStager
from orchestrator.tools import FunctionTool
from orchestrator.types import Content, Part
from tests.conftest import EXAMPLE_SKILLS
from tests.orchestrator.conftest import declared_tools, system_message, tool_messages
from tests.orchestrator.weather_tools import ask_name_information
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

LIBRARY = Path(__file__).resolve().parents[2] / "skills"


@pytest.fixture
async def repository(work_root):
    runtime = LocalWorkspaceRuntime(work_root)
    repo = create_default_skill_repository(str(LIBRARY), workspace_runtime=runtime, use_cached_repository=True)
    yield repo
    await runtime.close()


async def _turn(runner: Runner, text: str, session_id: str = "sess-1") -> list:
    message = Content(parts=[Part.from_text(text)])
    return [e async for e in runner.run_async(user_id="u", session_id=session_id, new_message=message)]


def _tool_result(body: dict, index: int = -1) -> dict:
    return json.loads(tool_messages(body)[index]["content"])


async def test_overview_always_body_after_load_docs_after_selection(model_server, model, repository):
    model_server.add(
        {"tool_calls": [{"name": "skill_load", "arguments": {"skill_name": "weather-tools"}}]},
        {"tool_calls": [{"name": "skill_select_docs", "arguments": {"skill_name": "weather-tools", "docs": ["API_REFERENCE.md"]}}]},
        {"text": "ready"},
    )
    agent = LlmAgent(name="a", model=model, instruction="Help.", tools=[SkillToolSet(repository)], skill_repository=repository)
    runner = Runner(app_name="t", agent=agent, session_service=InMemorySessionService())
    await _turn(runner, "weather please")
    first, second, third = (system_message(b) for b in model_server.requests)
    assert first.startswith("Help.\n\nAvailable skills:")
    for summary in repository.summaries():
        assert f"- {summary.name}: {summary.description}" in first
    assert "[Loaded]" not in first and "Overview" not in first
    assert "[Loaded] weather-tools" in second and "get_current_weather" in second
    assert "[Doc]" not in second
    assert "[Doc] weather-tools/API_REFERENCE.md" in third
    assert _tool_result(model_server.requests[1]) == {"result": "skill 'weather-tools' loaded"}
    assert _tool_result(model_server.requests[2]) == {"selected_docs": ["API_REFERENCE.md"], "include_all_docs": False}
    await runner.close()


async def test_loaded_skills_last_one_invocation(model_server, model, repository):
    model_server.add(
        {"tool_calls": [{"name": "skill_load", "arguments": {"skill_name": "python-math"}}]}, {"text": "loaded"},
        {"text": "next turn"},
    )
    agent = LlmAgent(name="a", model=model, tools=[SkillToolSet(repository)], skill_repository=repository)
    runner = Runner(app_name="t", agent=agent, session_service=InMemorySessionService())
    await _turn(runner, "one")
    await _turn(runner, "two")
    assert "[Loaded] python-math" in system_message(model_server.requests[1])
    assert "[Loaded]" not in system_message(model_server.requests[2])
    session = await runner.session_service.get_session(app_name="t", user_id="u", session_id="sess-1")
    assert not any(k.startswith("temp:") for k in session.state)


async def test_the_default_instruction_names_only_tools_that_exist(model_server, model, repository):
    model_server.add({"text": "hi"}, {"text": "hi"})
    runner = Runner(app_name="t", agent=LlmAgent(name="a", model=model, skill_repository=repository))
    await _turn(runner, "x")
    bare = system_message(model_server.requests[0])
    assert "Available skills:" in bare and "skill_load" not in bare and "skill_run" not in bare
    runner = Runner(app_name="t", agent=LlmAgent(name="a", model=model, tools=[SkillToolSet(repository)], skill_repository=repository))
    await _turn(runner, "x")
    full = system_message(model_server.requests[1])
    assert "skill_load(" in full and "skill_run(" in full and "skill_select_docs(" in full


async def test_seven_skill_tools_are_declared_with_their_arguments(model_server, model, repository):
    model_server.add({"text": "hi"})
    toolset = SkillToolSet(repository, skill_stager=LinkSkillStager(), run_tool_kwargs={"save_as_artifacts": True, "omit_inline_content": False})
    runner = Runner(app_name="t", agent=LlmAgent(name="a", model=model, tools=[toolset], skill_repository=repository))
    await _turn(runner, "x")
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in model_server.requests[0]["tools"]}
    assert list(tools) == [
        "skill_list", "skill_list_tools", "skill_load", "skill_select_tools", "skill_list_docs", "skill_select_docs", "skill_run",
    ]
    assert tools["skill_run"]["required"] == ["skill", "command"]
    assert set(tools["skill_run"]["properties"]) == {"skill", "command", "output_files", "env", "timeout", "secrets"}
    assert tools["skill_select_tools"]["properties"]["mode"]["enum"] == ["add", "replace", "clear"]
    assert "tool_context" not in json.dumps(tools)


async def test_dynamic_tool_set_declares_only_the_tools_loaded_skills_select(model_server, model, repository, caplog):
    model_server.add(
        {"text": "nothing loaded"},
        {"tool_calls": [{"name": "skill_load", "arguments": {"skill_name": "weather-tools"}}]},
        {"tool_calls": [{"name": "skill_select_tools", "arguments": {"skill_name": "weather-tools", "tools": ["get_current_weather"]}}]},
        {"tool_calls": [{"name": "get_current_weather", "arguments": {"city": "Beijing"}}]},
        {"tool_calls": [{"name": "skill_select_tools", "arguments": {"skill_name": "weather-tools", "mode": "clear"}}]},
        {"text": "done"},
    )
    dynamic = DynamicSkillToolSet(
        skill_repository=repository,
        available_tools=["get_current_weather", "get_weather_forecast", FunctionTool(ask_name_information)],
    )
    agent = LlmAgent(name="a", model=model, tools=[SkillToolSet(repository), dynamic], skill_repository=repository)
    runner = Runner(app_name="t", agent=agent, session_service=InMemorySessionService())
    await _turn(runner, "hello")
    await _turn(runner, "weather in Beijing")
    skill_tools = set(declared_tools(model_server.requests[0]))
    extra = [set(declared_tools(b)) - skill_tools for b in model_server.requests]
    assert extra[0] == set()
    assert extra[1] == set()  # before skill_load
    assert extra[2] == {"get_current_weather", "get_weather_forecast"}  # search_city_by_name is not in the pool
    assert extra[3] == {"get_current_weather"}
    assert _tool_result(model_server.requests[4])["temperature"] == 22
    assert extra[5] == set()
    assert "ask_name_information" not in str(extra)
    warnings = [r for r in caplog.records if "search_city_by_name" in r.getMessage()]
    assert len(warnings) == 1


async def test_skill_run_executes_in_the_sessions_workspace(model_server, model, repository, work_root):
    model_server.add(
        {"tool_calls": [{"name": "skill_run", "arguments": {
            "skill": "python-math", "command": "python3 scripts/fib.py 10 > $OUTPUT_DIR/fib.txt",
            "output_files": ["$OUTPUT_DIR/fib.txt"]}}]},
        {"tool_calls": [{"name": "skill_run", "arguments": {"skill": "python-math", "command": "cat out/fib.txt | wc -l"}}]},
        {"text": "ten numbers"},
    )
    agent = LlmAgent(name="a", model=model, tools=[SkillToolSet(repository)], skill_repository=repository)
    runner = Runner(app_name="t", agent=agent, session_service=InMemorySessionService())
    await _turn(runner, "fib please", session_id="fib-session")
    first = _tool_result(model_server.requests[1])
    assert set(first) == {"stdout", "stderr", "exit_code", "timed_out", "duration_ms", "output_files", "artifact_files"}
    assert first["exit_code"] == 0
    assert first["output_files"][0]["name"] == "out/fib.txt"
    assert first["output_files"][0]["content"].split()[-1] == "34"
    assert _tool_result(model_server.requests[2])["stdout"].strip() == "10"
    assert [p.name.split("_")[1] for p in work_root.glob("ws_*")] == ["u.fib-session"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"name": "skill_load", "arguments": {"skill_name": "nope"}}, "unknown skill 'nope'"),
        ({"name": "skill_run", "arguments": {"skill": "nope", "command": "ls"}}, "unknown skill 'nope'"),
        ({"name": "skill_run", "arguments": {"skill": "python-math", "command": "ls", "output_files": ["/etc/*"]}}, "outside the workspace"),
        ({"name": "skill_run", "arguments": {"skill": "python-math", "command": "ls", "timeout": -1}}, "timeout"),
        ({"name": "skill_select_docs", "arguments": {"skill_name": "python-math", "docs": ["NOPE.md"]}}, "has no doc 'NOPE.md'"),
        ({"name": "skill_select_tools", "arguments": {"skill_name": "weather-tools", "tools": ["hack"]}}, "does not declare 'hack'"),
    ],
)
async def test_bad_skill_tool_calls_get_clear_error_results(model_server, model, repository, call, message):
    model_server.add({"tool_calls": [call]}, {"text": "ok"})
    runner = Runner(app_name="t", agent=LlmAgent(name="a", model=model, tools=[SkillToolSet(repository)], skill_repository=repository))
    await _turn(runner, "x")
    assert message in _tool_result(model_server.requests[1])["error"]


async def test_skill_list_tools_and_docs_report_what_the_skill_declares(model_server, model, repository):
    model_server.add(
        {"tool_calls": [{"name": "skill_list", "arguments": {}},
                        {"name": "skill_list_tools", "arguments": {"skill_name": "weather-tools"}},
                        {"name": "skill_list_docs", "arguments": {"skill_name": "python-math"}}]},
        {"text": "ok"},
    )
    runner = Runner(app_name="t", agent=LlmAgent(name="a", model=model, tools=[SkillToolSet(repository)], skill_repository=repository))
    await _turn(runner, "x")
    listing, tools, docs = (json.loads(m["content"]) for m in tool_messages(model_server.requests[1]))
    assert listing == {"result": EXAMPLE_SKILLS}
    assert tools == {"result": ["get_current_weather", "get_weather_forecast", "search_city_by_name"]}
    assert docs == {"result": ["USAGE.md"]}
