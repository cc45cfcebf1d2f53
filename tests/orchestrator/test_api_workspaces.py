"""Kept workspaces through the HTTP API on the embedded default: listed per team and paged, removed (not another
team's, not while a run is in it), limited per team, removed when idle and with their session."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestrator.dispatch import InlineDispatcher
from tests.conftest import IS_ROOT, workspace_dirs
from tests.orchestrator.api_helpers import client, make_services, new_team
from tests.orchestrator.test_api_runs import held_user_ids
from worker.runtimes.local.runtime import LocalWorkspaceRuntime


def services_with(work_root, model_url: str = "http://127.0.0.1:9/v1", **options):
    runtime = LocalWorkspaceRuntime(work_root)
    return make_services(InlineDispatcher({"local": runtime}, **options), runtime.artifact_store,
                         work_root.parent / "data", model_url=model_url)


@pytest.fixture
async def services(work_root):
    built = services_with(work_root)
    yield built
    await built.close()


async def run_in(api, workspace_id: str | None, command: str = "echo hi >> $WORK_DIR/log", wait: bool = True) -> str:
    body = {"skill": "python-math", "command": command, "timeout": 60}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    submitted = await api.post("/v1/runs", json=body)
    assert submitted.status_code == 202, submitted.text
    run_id = submitted.json()["id"]
    if wait:
        done = (await api.get(f"/v1/runs/{run_id}", params={"wait": 60})).json()
        assert done["status"] == "finished", done
    return run_id


async def until_started(api, run_id: str) -> None:
    while (await api.get(f"/v1/runs/{run_id}")).json()["status"] != "started":
        await asyncio.sleep(0.02)


async def listed(api, **params) -> list[str]:
    page = await api.get("/v1/workspaces", params=params)
    assert page.status_code == 200, page.text
    return [w["id"] for w in page.json()["data"]]


async def test_each_team_lists_and_removes_its_own_workspaces_only(services, work_root):
    async with client(services, new_team(services, "team-a")) as a, client(services, new_team(services, "team-b")) as b:
        await run_in(a, "w1")
        await run_in(a, "w2")
        await run_in(a, None)  # one-off: not kept, not listed
        await run_in(b, "w1")
        await services.dispatcher.drain()
        assert await listed(a) == ["team-a.w1", "team-a.w2"]
        assert await listed(b) == ["team-b.w1"]
        first = (await a.get("/v1/workspaces", params={"limit": 1})).json()
        assert [w["id"] for w in first["data"]] == ["team-a.w1"] and first["total"] == 2 and first["next_offset"] == 1
        second = (await a.get("/v1/workspaces", params={"limit": 1, "offset": 1})).json()
        assert [w["id"] for w in second["data"]] == ["team-a.w2"] and second["next_offset"] is None
        one = (await a.get("/v1/workspaces/team-a.w1")).json()
        assert one["runtime"] == "local" and one["state"] == "kept" and one["runs"] == []
        assert one["last_used_at"] >= one["created_at"] and one["removed_when_idle_at"] is None  # no idle setting
        assert len(workspace_dirs(work_root)) == 3

        foreign = await b.delete("/v1/workspaces/team-a.w1")
        assert foreign.status_code == 404 and "team-b.<the workspace_id" in foreign.json()["detail"]
        assert (await b.get("/v1/workspaces/team-a.w1")).status_code == 404
        assert (await a.delete("/v1/workspaces/team-a.w1")).status_code == 204
        assert await listed(a) == ["team-a.w2"]
        assert await listed(b) == ["team-b.w1"]
        assert sorted(p.name.split("_")[1] for p in workspace_dirs(work_root)) == ["team-a.w2", "team-b.w1"]
        assert len(held_user_ids(services, work_root)) == (2 if IS_ROOT else 0)
        assert (await a.delete("/v1/workspaces/team-a.w1")).status_code == 404  # gone
        await run_in(a, "w1")  # the name can be used again: a new, empty workspace
        assert await listed(a) == ["team-a.w2", "team-a.w1"]


@pytest.mark.parametrize(("workspace_id", "status"), [
    ("team-a.nope", 404), ("nope", 404), ("-starts-with-a-dash", 422), ("x" * 65, 422), ("a%20b", 422),
    ("a;rm", 422),
])
async def test_bad_workspace_ids_are_refused_or_unknown(services, workspace_id, status):
    async with client(services, new_team(services, "team-a")) as a:
        for answer in (await a.delete(f"/v1/workspaces/{workspace_id}"), await a.get(f"/v1/workspaces/{workspace_id}")):
            assert answer.status_code == status, answer.text
            assert ("no workspace" if status == 404 else "workspace_id") in answer.json()["detail"]


async def test_a_workspace_with_a_run_in_it_cannot_be_removed_until_the_run_ends(services, work_root):
    async with client(services, new_team(services, "team-a")) as a:
        run_id = await run_in(a, "busy", "sleep 60", wait=False)
        await until_started(a, run_id)
        refused = await a.delete("/v1/workspaces/team-a.busy")
        assert refused.status_code == 409
        assert run_id in refused.json()["detail"] and "cancel" in refused.json()["detail"]
        assert (await a.get("/v1/workspaces/team-a.busy")).json()["runs"] == [run_id]
        assert len(workspace_dirs(work_root)) == 1
        await a.post(f"/v1/runs/{run_id}/cancel")
        assert (await a.get(f"/v1/runs/{run_id}", params={"wait": 30})).json()["status"] == "cancelled"
        assert (await a.delete("/v1/workspaces/team-a.busy")).status_code == 204
        await services.dispatcher.drain()
        assert workspace_dirs(work_root) == []


async def test_a_team_keeps_at_most_its_limit_of_workspaces(work_root):
    services = services_with(work_root, workspace_limit=2)
    async with client(services, new_team(services, "team-a")) as a, client(services, new_team(services, "team-b")) as b:
        await run_in(a, "w1")
        await run_in(a, "w2")
        refused = await a.post("/v1/runs", json={"skill": "python-math", "command": "true", "workspace_id": "w3"})
        assert refused.status_code == 409
        detail = refused.json()["detail"]
        assert "keeps 2 workspaces" in detail and "SKILLRUN_MAX_WORKSPACES_PER_TEAM" in detail
        assert "skillrun workspaces rm" in detail and "DELETE /v1/workspaces" in detail
        await run_in(a, "w1")  # a workspace it has is used as before
        await run_in(a, None)  # so is a one-off one
        await run_in(b, "w3")  # the other team has its own limit
        assert (await a.delete("/v1/workspaces/team-a.w2")).status_code == 204
        await run_in(a, "w3")
        assert await listed(a) == ["team-a.w1", "team-a.w3"]
        openapi = (await a.get("/openapi.json")).json()
        assert "SKILLRUN_MAX_WORKSPACES_PER_TEAM" in openapi["paths"]["/v1/runs"]["post"]["responses"]["409"]["description"]
    await services.close()


async def test_workspaces_unused_for_the_idle_time_are_removed_and_busy_ones_stay(work_root):
    services = services_with(work_root, workspace_idle_seconds=0.3)
    services.dispatcher.start()  # as the app's lifespan does
    async with client(services, new_team(services, "team-a")) as a:
        busy = await run_in(a, "busy", "sleep 60", wait=False)
        await until_started(a, busy)
        await run_in(a, "idle")
        entry = (await a.get("/v1/workspaces/team-a.idle")).json()
        assert entry["removed_when_idle_at"] == pytest.approx(entry["last_used_at"] + 0.3)
        deadline = time.monotonic() + 60
        while (await a.get("/v1/workspaces/team-a.idle")).status_code != 404:
            assert time.monotonic() < deadline, "the idle workspace was never removed"
            await asyncio.sleep(0.05)
        # used before the idle one, but a run is in it: it stays
        assert await listed(a) == ["team-a.busy"]
        assert [p.name.split("_")[1] for p in workspace_dirs(work_root)] == ["team-a.busy"]
        await a.post(f"/v1/runs/{busy}/cancel")
        await a.get(f"/v1/runs/{busy}", params={"wait": 30})
        while await listed(a):  # once its run ended, it goes too
            assert time.monotonic() < deadline, "the workspace whose run ended was never removed"
            await asyncio.sleep(0.05)
    await services.dispatcher.drain()
    assert workspace_dirs(work_root) == []
    assert held_user_ids(services, work_root) == []
    await services.close()


async def test_deleting_a_session_removes_its_workspace(model_server, work_root):
    model_server.add(
        {"tool_calls": [{"name": "skill_run", "arguments": {"skill": "python-math", "command": "echo x > $WORK_DIR/x"}}]},
        {"text": "done"},
    )
    services = services_with(work_root, model_url=model_server.base_url)
    async with client(services, new_team(services, "team-a")) as a, client(services, new_team(services, "team-b")) as b:
        assert (await a.post("/v1/sessions", json={"session_id": "chat-1"})).status_code == 201
        assert (await a.post("/v1/sessions/chat-1/messages", json={"text": "go"})).status_code == 200
        assert await listed(a) == ["team-a.chat-1"]  # the session's workspace is the team's
        assert len(workspace_dirs(work_root)) == 1
        assert (await b.delete("/v1/sessions/chat-1")).status_code == 404
        assert (await a.delete("/v1/sessions/chat-1")).status_code == 204
        assert (await a.get("/v1/sessions/chat-1")).status_code == 404
        assert await listed(a) == []
        assert workspace_dirs(work_root) == []
        assert held_user_ids(services, work_root) == []
        assert (await a.delete("/v1/sessions/chat-1")).status_code == 404
        assert (await a.post("/v1/sessions", json={"session_id": "no-runs"})).status_code == 201
        assert (await a.delete("/v1/sessions/no-runs")).status_code == 204  # a session without a workspace
    await services.close()
