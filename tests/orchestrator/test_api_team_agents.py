"""The API keeps one repository and agent per team, on the team's current library versions: a new version gets a new
agent and the old one is closed once its turns end; past the process's limit the least recently used team's go."""

from __future__ import annotations

import asyncio

from orchestrator.dispatch import InlineDispatcher
from orchestrator.services import Services
from orchestrator.sessions import InMemorySessionService
from tests.orchestrator.api_helpers import client, make_services, new_team
from tests.orchestrator.test_api_teams import skill_md, tar_gz
from worker.runtimes.local.runtime import LocalWorkspaceRuntime


def _services(model_server, work_root) -> tuple[Services, list]:
    runtime = LocalWorkspaceRuntime(work_root)
    services = make_services(InlineDispatcher({"local": runtime}), runtime.artifact_store, work_root.parent / "data",
                             model_url=model_server.base_url, session_service=InMemorySessionService())
    built = []
    factory = services.agent_factory

    def recording(repository):
        built.append(factory(repository))
        return built[-1]

    services.agent_factory = recording
    return services, built


def _version(n: int) -> bytes:
    return tar_gz({"team-skill/SKILL.md": skill_md("team-skill"), "team-skill/n.txt": f"{n}\n".encode()})


def _closed(agent) -> bool:
    return agent.model._client.is_closed()


async def _upload(c, n: int) -> None:
    answer = await c.post("/v1/libraries/main/upload", params={"filename": "v.tgz"}, content=_version(n))
    assert answer.status_code == 201, answer.text


async def _chat(c, model_server, session_id: str) -> None:
    model_server.add({"text": "done"})
    if (await c.get(f"/v1/sessions/{session_id}")).status_code == 404:
        assert (await c.post("/v1/sessions", json={"session_id": session_id})).status_code == 201
    answer = await c.post(f"/v1/sessions/{session_id}/messages", json={"text": "hi"})
    assert answer.status_code == 200 and "event: message" in answer.text, answer.text


async def _settle() -> None:
    for _ in range(20):  # a retired agent is closed by a task of the app's loop
        await asyncio.sleep(0)


async def test_a_new_library_version_gets_a_new_agent_and_the_old_one_is_closed(model_server, work_root):
    services, built = _services(model_server, work_root)
    async with client(services, new_team(services, "team-a")) as c:
        await _upload(c, 1)
        await _chat(c, model_server, "s1")
        await _chat(c, model_server, "s1")
        assert len(built) == 1, "an unchanged library keeps its agent"
        await _upload(c, 2)
        await _chat(c, model_server, "s1")
        await _settle()
        assert len(built) == 2 and _closed(built[0]) and not _closed(built[1])
        assert list(services._libraries) == ["team-a"]
    await services.close()
    assert _closed(built[1])


async def test_past_the_limit_the_least_recently_used_teams_repository_and_agent_go(model_server, work_root):
    services, built = _services(model_server, work_root)
    services.team_libraries_kept = 2
    teams = ["team-a", "team-b", "team-c"]
    keys = {team: new_team(services, team) for team in teams}
    for team in teams:
        async with client(services, keys[team]) as c:
            await _upload(c, 1)
            await _chat(c, model_server, f"{team}-s")
    await _settle()
    assert list(services._libraries) == ["team-b", "team-c"]
    assert [_closed(agent) for agent in built] == [True, False, False]
    async with client(services, keys["team-a"]) as c:  # it comes back on a fresh agent, and works
        await _chat(c, model_server, "team-a-s")
        assert [s["name"] for s in (await c.get("/v1/skills")).json()] == ["team-skill"]
    await _settle()
    assert list(services._libraries) == ["team-c", "team-a"]
    assert [_closed(agent) for agent in built] == [True, True, False, False]
    await services.close()
    assert all(_closed(agent) for agent in built)


async def test_an_agent_in_a_turn_is_closed_only_when_the_turn_ends(model_server, work_root):
    services, built = _services(model_server, work_root)
    team = new_team(services, "team-a")
    async with client(services, team) as c:
        await _upload(c, 1)
        assert (await c.post("/v1/sessions", json={"session_id": "s1"})).status_code == 201
        model_server.add({"text": "a long answer in several parts"})
        turn = services.turn(services.teams.get_team("team-a"), "s1", "hi")
        assert (await anext(turn)).partial
        await _upload(c, 2)
        services.repository_for(services.teams.get_team("team-a"))  # the version changed under the turn
        await _settle()
        assert not _closed(built[0])
        events = [event async for event in turn]
        assert events[-1].is_final_response() and events[-1].content.text == "a long answer in several parts"
        await _settle()
        assert _closed(built[0])
    await services.close()
