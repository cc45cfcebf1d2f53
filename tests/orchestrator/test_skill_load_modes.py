"""Skill load modes (once / turn / session), the loaded-skills cap, content in tool results, per-agent filters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.agents import LlmAgent
from orchestrator.config import Settings
from orchestrator.runners import Runner
from orchestrator.sessions import InMemorySessionService
from orchestrator.skills import (
    CachedSkillRepository,
    FilteredSkillRepository,
    SkillLoadMode,
    SkillOptions,
    SkillToolSet,
)
from orchestrator.types import Content, Part
from tests.conftest import write_skill
from tests.orchestrator.conftest import system_message, tool_messages

LIBRARY = Path(__file__).resolve().parents[2] / "skills"


@pytest.fixture
def repository() -> CachedSkillRepository:
    return CachedSkillRepository(LIBRARY)


def _runner(model, repository, **options) -> Runner:
    agent = LlmAgent(name="a", model=model, tools=[SkillToolSet(repository)], skill_repository=repository,
                     skill_options=SkillOptions(**options))
    return Runner(app_name="t", agent=agent, session_service=InMemorySessionService())


async def _turn(runner: Runner, text: str = "go") -> list:
    message = Content(parts=[Part.from_text(text)])
    return [e async for e in runner.run_async(user_id="u", session_id="s", new_message=message)]


def _load(name: str, **extra) -> dict:
    return {"tool_calls": [{"name": "skill_load", "arguments": {"skill_name": name, **extra}}]}


def _result(body: dict) -> dict:
    return json.loads(tool_messages(body)[-1]["content"])


def test_turn_is_the_default_load_mode():
    assert SkillOptions().load_mode is SkillLoadMode.TURN
    assert Settings().skill_load_mode == "turn"


async def test_once_injects_the_body_into_the_next_request_only(model_server, model, repository):
    model_server.add(_load("python-math"), {"tool_calls": [{"name": "skill_list", "arguments": {}}]}, {"text": "ok"})
    await _turn(_runner(model, repository, load_mode="once"))
    bodies = ["[Loaded] python-math" in system_message(b) for b in model_server.requests]
    assert bodies == [False, True, False]


async def test_turn_keeps_the_body_for_the_rest_of_the_message_only(model_server, model, repository):
    model_server.add(_load("python-math"), {"tool_calls": [{"name": "skill_list", "arguments": {}}]}, {"text": "ok"},
                     {"text": "next message"})
    runner = _runner(model, repository, load_mode="turn")
    await _turn(runner)
    await _turn(runner)
    assert ["[Loaded] python-math" in system_message(b) for b in model_server.requests] == [False, True, True, False]


async def test_session_keeps_the_body_across_messages(model_server, model, repository):
    model_server.add(_load("python-math"), {"text": "ok"}, {"text": "next message"})
    runner = _runner(model, repository, load_mode="session")
    await _turn(runner)
    await _turn(runner)
    assert "[Loaded] python-math" in system_message(model_server.requests[2])
    session = await runner.session_service.get_session(app_name="t", user_id="u", session_id="s")
    assert session.state["skill:loaded:python-math"] == "1"


async def test_past_the_cap_the_least_recently_used_skill_is_unloaded(model_server, model, repository):
    model_server.add(
        _load("python-math"), _load("weather-tools"),
        {"tool_calls": [{"name": "skill_select_docs", "arguments": {"skill_name": "python-math", "docs": ["USAGE.md"]}}]},
        _load("data-chart"), {"text": "ok"},
    )
    await _turn(_runner(model, repository, max_loaded_skills=2))
    last = system_message(model_server.requests[-1])
    assert "[Loaded] python-math" in last and "[Loaded] data-chart" in last
    assert "[Loaded] weather-tools" not in last  # used less recently than python-math, whose docs were selected
    assert _result(model_server.requests[4]) == {"result": "skill 'data-chart' loaded", "unloaded": ["weather-tools"]}


@pytest.mark.parametrize("cap", [0, -1])
def test_a_cap_below_one_is_refused(cap):
    with pytest.raises(ValueError, match="max_loaded_skills must be at least 1"):
        SkillOptions(max_loaded_skills=cap)
    with pytest.raises(ValidationError, match="max_loaded_skills"):
        Settings(max_loaded_skills=cap)


def test_an_unknown_load_mode_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown skill load mode 'forever' \(known: once, turn, session\)"):
        SkillOptions(load_mode="forever")
    with pytest.raises(ValidationError, match="skill_load_mode"):
        Settings(skill_load_mode="forever")


async def test_content_in_tool_results_keeps_the_system_message_stable(model_server, model, repository):
    model_server.add(
        _load("weather-tools"),
        {"tool_calls": [{"name": "skill_select_docs", "arguments": {"skill_name": "weather-tools", "docs": ["API_REFERENCE.md"]}}]},
        {"text": "ok"},
    )
    await _turn(_runner(model, repository, content_in_tool_results=True))
    first, second, third = (system_message(b) for b in model_server.requests)
    assert "[Loaded]" not in second + third and "[Doc]" not in third
    assert second == third and second.endswith("Loaded skills: weather-tools (their instructions are in the skill_load results).")
    loaded = _result(model_server.requests[1])
    assert loaded["result"] == "skill 'weather-tools' loaded"
    assert loaded["instructions"] == repository.get("weather-tools").body and loaded["docs"] == {}
    docs = _result(model_server.requests[2])
    assert docs["docs"] == {"API_REFERENCE.md": repository.get("weather-tools").doc("API_REFERENCE.md").content}


async def test_a_filtered_agent_sees_and_loads_only_its_skills(model_server, model, repository, tmp_path):
    write_skill(tmp_path / "team-b", "secret-tool")
    both = CachedSkillRepository([LIBRARY, tmp_path / "team-b"])
    visible = FilteredSkillRepository(both, names=["python-*", "weather-*", "secret-*"], roots=[LIBRARY])
    assert visible.skill_list() == ["python-math", "weather-tools"]
    model_server.add(_load("secret-tool"), {"tool_calls": [{"name": "skill_search", "arguments": {"query": "secret"}}]},
                     {"text": "ok"})
    await _turn(_runner(model, visible, overview_max_chars=10))
    overview = system_message(model_server.requests[0])
    assert "secret" not in overview and "data-chart" not in overview
    assert "unknown skill 'secret-tool' (available: python-math, weather-tools)" in _result(model_server.requests[1])["error"]
    assert _result(model_server.requests[2])["skills"] == []


def test_a_filter_of_no_pattern_is_refused(repository):
    with pytest.raises(ValueError, match="at least one pattern"):
        FilteredSkillRepository(repository, names=[])


def test_the_settings_become_the_assistants_skill_options():
    settings = Settings(skill_load_mode="session", max_loaded_skills=3, skill_content_in_tool_results=True,
                        skill_overview_max_chars=100, skill_overview_skills=2, skill_overview_names=4,
                        skill_search_page_size=7)
    assert SkillOptions.from_settings(settings) == SkillOptions(
        load_mode=SkillLoadMode.SESSION, max_loaded_skills=3, content_in_tool_results=True, overview_max_chars=100,
        overview_skills=2, overview_names=4, search_page_size=7,
    )
