"""The three tiers at team scale: the bounded overview, its index, skill_search, and their bad inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.agents import LlmAgent
from orchestrator.context import InvocationContext
from orchestrator.runners import Runner
from orchestrator.sessions import Session
from orchestrator.skills import (
    CachedSkillRepository,
    SkillIndex,
    SkillOptions,
    SkillSummary,
    SkillToolSet,
    build_overview,
)
from orchestrator.skills.injection import skill_instructions
from orchestrator.skills.search import MAX_QUERY_TERMS, terms
from orchestrator.tools import FunctionTool
from orchestrator.types import Content, Part
from tests.conftest import write_skill
from tests.orchestrator.conftest import declared_tools, system_message, tool_messages
from tests.synthetic_skills import labelled_requests, write_library
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

TOOLS = {"skill_load", "skill_run", "skill_search"}
LONG_QUERY_CHARS = 10_000


@pytest.fixture(scope="module")
def big_library(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("big-library")
    root.chmod(0o755)
    write_library(root, 2000)
    return root


@pytest.fixture(scope="module")
def big_repository(big_library) -> CachedSkillRepository:
    return CachedSkillRepository(big_library)


def _ctx() -> InvocationContext:
    return InvocationContext(session=Session(app_name="t", user_id="u"), agent=None)


async def _turn(runner: Runner, text: str, session_id: str = "s") -> list:
    message = Content(parts=[Part.from_text(text)])
    return [e async for e in runner.run_async(user_id="u", session_id=session_id, new_message=message)]


def test_below_the_size_the_overview_is_exactly_every_skill(tmp_path):
    write_skill(tmp_path, "beta")
    write_skill(tmp_path, "alpha")
    text = skill_instructions(CachedSkillRepository(tmp_path), {}, set(), "anything at all")
    assert text == "Available skills:\n- alpha: The alpha skill.\n- beta: The beta skill."


def test_an_empty_library_still_says_so(tmp_path):
    (tmp_path / "empty").mkdir()
    assert skill_instructions(CachedSkillRepository(tmp_path / "empty"), {}, set()) == "Available skills:\n- (none)"


def test_past_the_size_the_overview_carries_the_best_matches_and_how_to_find_the_rest(big_repository):
    options = SkillOptions()
    request = labelled_requests(2000)[0]
    text = skill_instructions(big_repository, {}, TOOLS, request.text, options)
    overview = build_overview(big_repository.index(), options, request.text)
    assert overview.cut and request.skill in overview.described + overview.named
    assert len(overview.text) <= options.overview_max_chars + 200  # the budget bounds the skill lines
    assert text.startswith(f"Available skills (the {options.overview_skills} of 2,000 most relevant")
    shown = len(overview.described) + len(overview.named)
    assert f"{2000 - shown:,} more skills are not listed. Find them with skill_search(query=...)." in text
    assert text.count("\n- ") == options.overview_skills


def test_the_loaded_skills_steer_the_ranking(big_repository):
    index = big_repository.index()
    loaded = index.summary("reconcile-surveys-1860")
    plain = build_overview(index, SkillOptions(), "balance").described
    steered = build_overview(index, SkillOptions(), "balance", [loaded]).described
    assert "reconcile-surveys-1860" not in plain[:1]
    assert steered[0] == "reconcile-surveys-1860"


def test_a_query_that_matches_nothing_lists_no_skill_but_says_how_many_exist(big_repository):
    text = skill_instructions(big_repository, {}, TOOLS, "")
    assert text.startswith("Available skills: none of the 2,000 matches this conversation yet.")
    assert "2,000 skills are not listed. Find them with skill_search(query=...)." in text


def test_the_search_hint_appears_only_with_the_search_tool(big_repository):
    text = skill_instructions(big_repository, {}, {"skill_load"}, "balance invoices")
    assert "skill_search" not in text and "more skills are not listed." in text


def test_a_query_of_10000_characters_still_finds_the_skill(big_repository):
    request = labelled_requests(2000)[3]
    long_query = request.text + " " + ("lorem ipsum dolor sit amet " * 400)[: LONG_QUERY_CHARS - len(request.text) - 1]
    assert len(long_query) == LONG_QUERY_CHARS
    overview = build_overview(big_repository.index(), SkillOptions(), long_query)
    assert request.skill in overview.described + overview.named
    found = SkillToolSet(big_repository).skill_search(long_query, _ctx())
    assert "error" not in found and found["skills"]


def test_a_query_of_many_distinct_words_scores_only_the_rarest(big_repository):
    index = big_repository.index()
    words = " ".join(s.name.replace("-", " ") for s in index.summaries[:150])
    assert len(set(terms(words))) > MAX_QUERY_TERMS
    best = index.search(words, 5)
    assert best and best[0].summary.name in [s.name for s in index.summaries[:150]]


def test_a_long_query_is_read_at_both_ends(big_repository):
    request = labelled_requests(2000)[3]
    pasted = "lorem ipsum dolor sit amet " * 400
    overview = build_overview(big_repository.index(), SkillOptions(), pasted + request.text)
    assert request.skill in overview.described + overview.named


def test_skill_search_pages_through_the_matches(big_repository):
    toolset = SkillToolSet(big_repository)
    first = toolset.skill_search("reconcile", _ctx())
    second = toolset.skill_search("reconcile", _ctx(), page=2)
    assert len(first["skills"]) == SkillOptions().search_page_size and first["more"] is True
    assert {s["name"] for s in first["skills"]}.isdisjoint(s["name"] for s in second["skills"])
    assert all(s["name"].startswith("reconcile-") for s in first["skills"] + second["skills"])
    assert set(first["skills"][0]) == {"name", "description"}
    last = toolset.skill_search("reconcile", _ctx(), page=100)
    assert last == {"skills": [], "page": 100, "more": False}


@pytest.mark.parametrize(("query", "page", "message"), [
    ("", 1, "the query is empty"),
    ("   \n", 1, "the query is empty"),
    ("invoices", 0, "page must be 1 or more"),
])
def test_skill_search_refuses_bad_input_with_a_clear_error(big_repository, query, page, message):
    assert message in SkillToolSet(big_repository).skill_search(query, _ctx(), page=page)["error"]


async def test_skill_search_is_declared_only_when_the_overview_is_cut(model_server, model, big_repository, tmp_path):
    write_skill(tmp_path, "alpha")
    small = CachedSkillRepository(tmp_path)
    model_server.add({"text": "a"}, {"text": "b"})
    for repository in (small, big_repository):
        agent = LlmAgent(name="a", model=model, tools=[SkillToolSet(repository)], skill_repository=repository)
        await _turn(Runner(app_name="t", agent=agent), "hello")
    assert "skill_search" not in declared_tools(model_server.requests[0])
    assert "skill_search" in declared_tools(model_server.requests[1])


def test_the_index_is_built_once_per_repository_version(tmp_path):
    write_skill(tmp_path, "alpha")
    repository = CachedSkillRepository(tmp_path)
    index = repository.index()
    assert repository.index() is index
    write_skill(tmp_path, "gamma")
    changed = repository.index()
    assert changed is not index and changed.summary("gamma") is not None
    (tmp_path / "gamma" / "SKILL.md").write_text("---\nname: gamma\ndescription: Edited in place.\n---\n")
    assert repository.index().summary("gamma").description == "Edited in place."


def test_the_index_ranks_name_and_description_matches():
    index = SkillIndex([
        SkillSummary("pdf-tools", "Merge and split documents."),
        SkillSummary("csv-tools", "Convert spreadsheets into PDF reports."),
        SkillSummary("mail", "Send letters."),
    ])
    assert [h.summary.name for h in index.search("pdf", 5)] == ["pdf-tools", "csv-tools"]
    assert index.search("", 5) == [] and index.search("the and of", 5) == []
    assert index.count("spreadsheet") == 1  # "spreadsheets" and "spreadsheet" share a stem


async def test_a_library_change_mid_turn_is_seen_by_the_next_request_and_a_removed_skill_is_reported(
    model_server, model, tmp_path
):
    write_skill(tmp_path, "alpha", body="Alpha instructions.")
    write_skill(tmp_path, "beta")
    repository = CachedSkillRepository(tmp_path)

    def edit_library() -> str:
        """Remove alpha and add gamma."""
        shutil.rmtree(tmp_path / "alpha")
        write_skill(tmp_path, "gamma")
        return "edited"

    model_server.add(
        {"tool_calls": [{"name": "skill_load", "arguments": {"skill_name": "alpha"}}]},
        {"tool_calls": [{"name": "edit_library", "arguments": {}}]},
        {"tool_calls": [{"name": "skill_load", "arguments": {"skill_name": "alpha"}}]},
        {"text": "done"},
    )
    agent = LlmAgent(name="a", model=model, tools=[SkillToolSet(repository), FunctionTool(edit_library)],
                     skill_repository=repository)
    events = await _turn(Runner(app_name="t", agent=agent), "go")
    assert not any(e.error_code for e in events)
    before, after = system_message(model_server.requests[1]), system_message(model_server.requests[2])
    assert "[Loaded] alpha\n\nAlpha instructions." in before and "gamma" not in before
    assert "- gamma: The gamma skill." in after and "- alpha:" not in after
    assert "[Loaded] alpha\n\n(this skill is no longer in the library" in after
    error = json.loads(tool_messages(model_server.requests[3])[-1]["content"])["error"]
    assert "unknown skill 'alpha'" in error


async def test_a_turn_finds_and_runs_the_right_skill_out_of_2000(model_server, model, big_library, work_root):
    runtime = LocalWorkspaceRuntime(work_root)
    repository = CachedSkillRepository(big_library, workspace_runtime=runtime)
    request = labelled_requests(2000)[5]

    def pick(body: dict) -> dict:
        """A model that loads the first listed skill the system message offers for this request."""
        overview = system_message(body)
        names = [line[2:].split(":")[0] for line in overview.splitlines() if line.startswith("- ")]
        names += overview.split("Also relevant, by name: ")[1].split("\n")[0].rstrip(".").split(", ")
        assert request.skill in names, "the right skill is not in the overview"
        return {"tool_calls": [{"name": "skill_load", "arguments": {"skill_name": request.skill}}]}

    model_server.add(
        pick,
        {"tool_calls": [{"name": "skill_run", "arguments": {
            "skill": request.skill, "command": "bash scripts/run.sh", "output_files": ["out/result.txt"]}}]},
        {"text": "done"},
    )
    agent = LlmAgent(name="a", model=model, tools=[SkillToolSet(repository)], skill_repository=repository)
    runner = Runner(app_name="t", agent=agent)
    await _turn(runner, request.text)
    assert "skill_search" in declared_tools(model_server.requests[0])
    assert f"[Loaded] {request.skill}" in system_message(model_server.requests[1])
    result = json.loads(tool_messages(model_server.requests[2])[-1]["content"])
    assert result["exit_code"] == 0, result
    assert result["output_files"][0]["content"].strip() == f"{request.skill} done"
    await runner.close()
    await runtime.close()


def test_an_unknown_skill_error_names_the_closest_skills_not_the_whole_library(big_repository):
    error = SkillToolSet(big_repository).skill_list_tools("reconcile-invoice")["error"]
    assert error.startswith("unknown skill 'reconcile-invoice'")
    assert "reconcile-invoices-" in error and len(error) < 1000


async def test_a_turn_whose_skill_is_not_listed_finds_it_with_one_search(model_server, model, big_library, work_root):
    runtime = LocalWorkspaceRuntime(work_root)
    repository = CachedSkillRepository(big_library, workspace_runtime=runtime)
    request = labelled_requests(2000)[7]

    def pick_from_search(body: dict) -> dict:
        """A model that loads the first search result named like the request's skill."""
        found = [s["name"] for s in json.loads(tool_messages(body)[-1]["content"])["skills"]]
        assert request.skill in found, "one skill_search did not find the skill"
        return {"tool_calls": [{"name": "skill_run", "arguments": {
            "skill": request.skill, "command": "bash scripts/run.sh", "output_files": ["out/result.txt"]}}]}

    model_server.add(
        {"tool_calls": [{"name": "skill_search", "arguments": {"query": request.text}}]},
        pick_from_search,
        {"text": "done"},
    )
    options = SkillOptions(overview_skills=0, overview_names=0)  # the overview lists nothing: searching is the way
    agent = LlmAgent(name="a", model=model, tools=[SkillToolSet(repository)], skill_repository=repository,
                     skill_options=options)
    runner = Runner(app_name="t", agent=agent)
    await _turn(runner, request.text)
    overview = system_message(model_server.requests[0])
    assert overview.startswith("Available skills: 2,000 exist; none is described here.\n2,000 skills are not listed.")
    result = json.loads(tool_messages(model_server.requests[2])[-1]["content"])
    assert result["output_files"][0]["content"].strip() == f"{request.skill} done"
    await runner.close()
    await runtime.close()
