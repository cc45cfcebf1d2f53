"""The API's ``/mcp``: the team's skill library over streamable HTTP, runs through Redis and a worker process.

Driven by the ``mcp`` SDK's own client (and plain HTTP where a test needs to send what that client would not).
"""

from __future__ import annotations

import contextlib
import io
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from mcp import ClientSession, McpError
from mcp.client.streamable_http import streamable_http_client

from orchestrator.dispatch import QueueDispatcher
from tests.conftest import workspace_dirs
from tests.orchestrator.api_helpers import api_in_a_thread, make_services, new_team
from tests.processes import _within
from worker.artifacts import FileArtifactStore

ACCEPT = "application/json, text/event-stream"


@pytest.fixture
async def api(redis_url, workers, shared_dir: Path) -> AsyncIterator[tuple[str, object]]:
    workers.start()
    dispatcher = QueueDispatcher(redis_url)
    services = make_services(dispatcher, FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data")
    with api_in_a_thread(services) as url:
        yield url, services
    await services.close()


@contextlib.asynccontextmanager
async def mcp_session(url: str, key: str | None) -> AsyncIterator[tuple[ClientSession, object]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=120)) as client, \
            streamable_http_client(f"{url}/mcp", http_client=client) as (read, write, session_id), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session, session_id


def library_archive(skill: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = f"---\nname: {skill}\ndescription: Only one team has this.\n---\nSecret steps.\n".encode()
        info = tarfile.TarInfo(f"{skill}/SKILL.md")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def test_a_team_lists_reads_and_runs_a_skill_through_the_queue_and_receives_its_file(api, work_root):
    url, services = api
    key = new_team(services, "alpha")
    async with mcp_session(url, key) as (session, _):
        tools = [tool.name for tool in (await session.list_tools()).tools]
        resources = [str(r.uri) for r in (await session.list_resources()).resources]
        skill_md = (await session.read_resource("skill://python-math/SKILL.md")).contents[0].text
        result = await session.call_tool("skill_run", {
            "skill": "python-math", "command": "python3 scripts/fib.py 5 > $OUTPUT_DIR/fib.txt; echo done",
            "output_files": ["out/fib.txt"],
        })
        again = await session.call_tool("skill_run", {"skill": "python-math", "command": "cat $OUTPUT_DIR/fib.txt"})
        assert len(workspace_dirs(work_root)) == 1
    assert "skill_run" in tools and "skill://python-math/SKILL.md" in resources
    assert skill_md.startswith("---\nname: python-math")
    assert not result.isError, result.content[0].text
    assert result.structuredContent["stdout"] == "done\n"
    [file_block] = result.content[1:]
    assert file_block.type == "text" and file_block.meta["skillrun/file"]["name"] == "out/fib.txt"
    assert file_block.text.split() == ["0", "1", "1", "2", "3"]
    assert again.structuredContent["stdout"].split() == ["0", "1", "1", "2", "3"]  # the session's workspace
    # The runs are the team's: its key lists them, another team's does not
    mine = httpx.get(f"{url}/v1/runs", headers={"Authorization": f"Bearer {key}"}).json()
    theirs = httpx.get(f"{url}/v1/runs", headers={"Authorization": f"Bearer {new_team(services, 'beta')}"}).json()
    assert mine["count"] == 2 and theirs["count"] == 0
    # The client closed its session (DELETE): the workspace goes with it
    assert _within(30, lambda: workspace_dirs(work_root) == [])


async def test_a_second_team_sees_none_of_the_first_teams_library(api, shared_dir):
    url, services = api
    alpha, beta = new_team(services, "alpha"), new_team(services, "beta")
    archive = shared_dir / "alpha.tar.gz"
    archive.write_bytes(library_archive("alpha-secret"))
    services.libraries.add_from_file("alpha", "private", archive)
    async with mcp_session(url, alpha) as (session, _):
        alpha_listing = (await session.call_tool("skill_list", {})).structuredContent["result"]
        alpha_resources = [str(r.uri) for r in (await session.list_resources()).resources]
    async with mcp_session(url, beta) as (session, _):
        beta_listing = (await session.call_tool("skill_list", {})).structuredContent["result"]
        beta_resources = [str(r.uri) for r in (await session.list_resources()).resources]
        with pytest.raises(McpError, match="unknown skill 'alpha-secret'"):
            await session.read_resource("skill://alpha-secret/SKILL.md")
        loaded = await session.call_tool("skill_load", {"skill_name": "alpha-secret"})
    assert alpha_listing == ["alpha-secret"] and "skill://alpha-secret/SKILL.md" in alpha_resources
    assert "alpha-secret" not in beta_listing and "python-math" in beta_listing
    assert not any("alpha-secret" in uri for uri in beta_resources)
    assert loaded.isError and "unknown skill 'alpha-secret'" in loaded.content[0].text


async def test_a_missing_wrong_or_revoked_key_is_refused(api):
    url, services = api
    refused = httpx.post(f"{url}/mcp", headers={"Accept": ACCEPT}, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert refused.status_code == 401 and "missing API key" in refused.json()["detail"]
    wrong = httpx.post(f"{url}/mcp", headers={"Accept": ACCEPT, "Authorization": "Bearer sk-nope"},
                       json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert wrong.status_code == 401 and "invalid or revoked" in wrong.json()["detail"]
    with pytest.raises(Exception) as failure:
        async with mcp_session(url, "sk-nope"):
            pass
    assert "401" in repr(failure.value.exceptions if isinstance(failure.value, BaseExceptionGroup) else failure.value)
    services.teams.create_team("gamma")
    api_key, key = services.teams.create_key("gamma")
    async with mcp_session(url, key) as (session, session_id):
        assert (await session.call_tool("skill_list", {})).isError is False
        services.teams.revoke_key(api_key.id)
        revoked = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 7, "method": "tools/list"},
                             headers={"Authorization": f"Bearer {key}", "Accept": ACCEPT,
                                      "mcp-session-id": session_id()})
        assert revoked.status_code == 401


async def test_a_session_answers_only_the_team_that_opened_it(api):
    url, services = api
    alpha, beta = new_team(services, "alpha"), new_team(services, "beta")
    async with mcp_session(url, alpha) as (session, session_id):
        await session.call_tool("skill_list", {})
        stolen = httpx.post(f"{url}/mcp", headers={"Authorization": f"Bearer {beta}", "Accept": ACCEPT,
                                                    "mcp-session-id": session_id(), "mcp-protocol-version": "2025-06-18"},
                            json={"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
                                "name": "skill_run", "arguments": {"skill": "python-math", "command": "echo hijacked"}}})
        assert (await session.call_tool("skill_list", {})).isError is False  # the owner's session goes on
    assert stolen.status_code == 404 and "Session not found" in stolen.text


async def test_a_run_that_times_out_comes_back_as_an_error_result_with_its_partial_output(api):
    url, services = api
    async with mcp_session(url, new_team(services, "alpha")) as (session, _):
        result = await session.call_tool("skill_run", {"skill": "python-math", "command": "echo partial; sleep 30",
                                                        "timeout": 1})
    assert result.isError
    assert result.structuredContent["timed_out"] is True and result.structuredContent["stdout"] == "partial\n"
