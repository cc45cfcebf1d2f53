"""The HTTP API's sessions: create, stream a message's events as SSE, read back; shared through Redis."""

from __future__ import annotations

import json

import httpx

from orchestrator.dispatch import InlineDispatcher
from orchestrator.services import Services
from orchestrator.sessions import InMemorySessionService, RedisSessionService
from tests.conftest import EXAMPLE_SKILLS
from tests.orchestrator.api_helpers import client, make_services, new_team
from worker.runtimes.local.runtime import LocalWorkspaceRuntime


def _services(model_server, work_root, session_service) -> Services:
    runtime = LocalWorkspaceRuntime(work_root)
    return make_services(InlineDispatcher({"local": runtime}), runtime.artifact_store, work_root.parent / "data",
                         model_url=model_server.base_url, session_service=session_service)


def _client(services: Services) -> httpx.AsyncClient:
    return client(services, new_team(services, "team-a"))


def parse_sse(text: str) -> list[tuple[str, dict]]:
    """The (event, data) pairs of a server-sent event stream; comment lines (keep-alive pings) are skipped."""
    items = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if lines:
            items.append((lines["event"], json.loads(lines["data"])))
    return items


async def test_a_message_streams_text_tool_calls_results_and_the_final_answer(model_server, work_root):
    model_server.add(
        {"tool_calls": [{"name": "skill_run", "arguments": {"skill": "python-math", "command": "python3 scripts/fib.py 5"}}]},
        {"text": "The first five are 0 1 1 2 3."},
    )
    async with _client(_services(model_server, work_root, InMemorySessionService())) as client:
        created = (await client.post("/v1/sessions", json={"session_id": "api-1"})).json()
        assert created["id"] == "api-1"
        response = await client.post("/v1/sessions/api-1/messages", json={"text": "fib 5"})
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        items = parse_sse(response.text)
        kinds = [k for k, _ in items]
        assert kinds[0] == "tool_call" and kinds[1] == "tool_result"
        assert items[1][1]["response"]["stdout"] == "0\n1\n1\n2\n3\n"
        assert "text_delta" in kinds
        assert "".join(d["text"] for k, d in items if k == "text_delta") == "The first five are 0 1 1 2 3."
        assert kinds[-2:] == ["message", "done"]
        assert items[-2][1]["usage"]["prompt_tokens"] == 11
        stored = (await client.get("/v1/sessions/api-1")).json()
        assert [e["author"] for e in stored["events"]] == ["user", "skillrun_assistant", "skillrun_assistant", "skillrun_assistant"]


async def test_unknown_session_answers_404_and_a_duplicate_409(model_server, work_root):
    async with _client(_services(model_server, work_root, InMemorySessionService())) as client:
        assert (await client.get("/v1/sessions/nope")).status_code == 404
        assert (await client.post("/v1/sessions/nope/messages", json={"text": "hi"})).status_code == 404
        assert (await client.post("/v1/sessions", json={"session_id": "dup"})).status_code == 201
        conflict = await client.post("/v1/sessions", json={"session_id": "dup"})
        assert conflict.status_code == 409 and "already exists" in conflict.json()["detail"]
        bad = await client.post("/v1/sessions", json={"session_id": "../etc"})
        assert bad.status_code == 422


async def test_a_model_failure_is_reported_on_the_stream(model_server, work_root):
    model_server.add({"status": 401, "text": "bad key"})
    async with _client(_services(model_server, work_root, InMemorySessionService())) as client:
        await client.post("/v1/sessions", json={"session_id": "e"})
        items = parse_sse((await client.post("/v1/sessions/e/messages", json={"text": "hi"})).text)
        assert items[0][0] == "error" and "refused the request" in items[0][1]["message"]
        assert items[-1][0] == "done"


async def test_two_api_processes_share_sessions_through_redis(model_server, work_root, redis_url):
    model_server.add({"text": "first answer"}, {"text": "second answer"})
    one = _services(model_server, work_root, RedisSessionService(redis_url))
    two = _services(model_server, work_root, RedisSessionService(redis_url))
    async with _client(one) as a, _client(two) as b:
        await a.post("/v1/sessions", json={"session_id": "shared"})
        await a.post("/v1/sessions/shared/messages", json={"text": "hello"})
        await b.post("/v1/sessions/shared/messages", json={"text": "and again"})
        history = [m["role"] for m in model_server.requests[-1]["messages"]]
        assert history == ["system", "user", "assistant", "user"]
        stored = (await a.get("/v1/sessions/shared")).json()
        assert [e["content"]["parts"][0]["text"] for e in stored["events"]] == ["hello", "first answer", "and again", "second answer"]


async def test_health_and_openapi_document_the_routes(model_server, work_root):
    async with _client(_services(model_server, work_root, InMemorySessionService())) as client:
        assert (await client.get("/healthz")).json() == {"status": "ok", "skills": len(EXAMPLE_SKILLS)}
        paths = (await client.get("/openapi.json")).json()["paths"]
        assert {"/healthz", "/v1/sessions", "/v1/sessions/{session_id}", "/v1/sessions/{session_id}/messages"} <= set(paths)
        assert "text/event-stream" in paths["/v1/sessions/{session_id}/messages"]["post"]["responses"]["200"]["content"]
