"""Text no store can keep (issue 30, finding 9): a lone surrogate in any string a request brings.

JSON's ``"\\ud800"`` escape decodes to a lone surrogate, which UTF-8 cannot encode: before the fix a session's state
holding one was a 500 (the Redis session store could not encode it; the in-memory and file stores took it and every
read after failed). Each test sends one — high (``\\ud800``), low (``\\udc00``), a pair in the wrong order
(``\\ude00\\ud83d``) — in a value, in a key of a dict, and deep in nested lists, through every way a request's strings
reach a store: the API's bodies (sessions and their state, messages, runs, libraries, secrets), its path and query,
the console's forms, the MCP endpoint's tool arguments, and the stores themselves called directly. Each must be a 4xx
naming the field (MCP: a JSON-RPC invalid-params error), never a 500, with nothing stored or run — over the Redis
stores and the in-memory and file ones.
"""

from __future__ import annotations

import json
from secrets import token_hex

import httpx
import pytest
from pydantic import ValidationError

from orchestrator.api import create_app
from orchestrator.dispatch import InlineDispatcher, QueueDispatcher
from orchestrator.documents import FileDocuments, RedisDocuments
from orchestrator.egress import EgressListError, EgressStore
from orchestrator.errors import UnencodableTextError
from orchestrator.events import Event
from orchestrator.quotas import Quotas, TeamQuota
from orchestrator.sessions import FileSessionService, InMemorySessionService, RedisSessionService
from orchestrator.teams import TeamError, TeamStore
from orchestrator.types import Content, Part
from tests.attacks.console_fixtures import SKILL, console, csrf_of  # noqa: F401 - fixtures
from tests.attacks.test_mcp_attacks import (  # noqa: F401 - fixtures
    INVALID_PARAMS,
    api,
    secrets,
    server_library,
    start_api,
)
from tests.orchestrator.api_helpers import LIBRARY, make_services, new_team
from worker.artifacts import FileArtifactStore
from worker.contract import RunRequest, SkillRef
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

SURROGATES = {"high": "\ud800", "low": "\udc00", "reversed-pair": "\ude00\ud83d"}
PLACES = {
    "value": lambda s: {"note": f"a{s}b"},
    "dict-key": lambda s: {"outer": {f"k{s}": "v"}},
    "deep-list": lambda s: {"notes": [[["x", [[f"deep {s}"]]]]]},
}
STACKS = ["memory", "file", "redis"]


@pytest.fixture(params=STACKS)
async def stack(request, work_root, shared_dir):
    """The API's services with their stores in memory (sessions; runs inline; registries in files), in files
    (sessions too), or in a real Redis (sessions, runs on the queue, registries)."""
    data = shared_dir / "data"
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        built = make_services(QueueDispatcher(url), FileArtifactStore(shared_dir / "artifacts"), data,
                              session_service=RedisSessionService(url), documents=RedisDocuments(url))
    else:
        runtime = LocalWorkspaceRuntime(work_root)
        sessions = InMemorySessionService() if request.param == "memory" else FileSessionService(data / "sessions")
        built = make_services(InlineDispatcher({"local": runtime}), runtime.artifact_store, data,
                              session_service=sessions)
    yield built
    await built.close()


def raw_client(services, key: str) -> httpx.AsyncClient:
    """A client of the app where an exception the app lets out is a 500 answer (as under uvicorn), not raised."""
    transport = httpx.ASGITransport(app=create_app(services=services), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t", headers={"Authorization": f"Bearer {key}"})


def as_json(body: object) -> dict[str, str | bytes]:
    """``body`` as JSON with every surrogate sent as its ``\\uXXXX`` escape (as a client can)."""
    return {"content": json.dumps(body).encode(), "headers": {"content-type": "application/json"}}


def refused(answer: httpx.Response, field: str) -> None:
    assert answer.status_code == 422, (answer.status_code, answer.text[:300])
    detail = answer.json()["detail"]
    assert field in detail and "lone surrogate" in detail, detail


# ---- the API's bodies -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("surrogate", SURROGATES)
async def test_a_lone_surrogate_in_a_sessions_state_is_a_422_naming_it_and_no_session_is_stored(
        stack, surrogate, place):
    state = PLACES[place](SURROGATES[surrogate])
    async with raw_client(stack, new_team(stack, "team-a")) as http:
        answer = await http.post("/v1/sessions", **as_json({"session_id": "s1", "state": state}))
        refused(answer, "state")
        assert (await http.get("/v1/sessions/s1")).status_code == 404
    assert await stack.session_service.get_session(app_name=stack.app_name, user_id="team-a", session_id="s1") is None


@pytest.mark.parametrize("surrogate", SURROGATES)
async def test_a_lone_surrogate_in_a_message_is_refused_and_the_session_keeps_no_event(stack, surrogate):
    async with raw_client(stack, new_team(stack, "team-a")) as http:
        assert (await http.post("/v1/sessions", json={"session_id": "s1", "state": {"ok": "é"}})).status_code == 201
        answer = await http.post("/v1/sessions/s1/messages", **as_json({"text": f"hello {SURROGATES[surrogate]}"}))
        refused(answer, "text")
        session = (await http.get("/v1/sessions/s1")).json()
    assert session["events"] == [] and session["state"] == {"ok": "é"}


RUN_FIELDS = {
    "command": lambda s: ({"command": f"echo {s}"}, "command"),
    "env-value": lambda s: ({"env": {"V": f"x{s}"}}, "env"),
    "env-name": lambda s: ({"env": {f"V{s}": "x"}}, "env"),
    "cwd": lambda s: ({"cwd": f"work/{s}"}, "cwd"),
    "output-file": lambda s: ({"output_files": ["out/a", f"out/{s}"]}, "output_files"),
    "input-name": lambda s: ({"inputs": [{"name": f"in{s}", "content": ""}]}, "inputs"),
    "input-content": lambda s: ({"inputs": [{"name": "in", "content": f"QUJD{s}"}]}, "inputs"),
    "skill": lambda s: ({"skill": f"python-math{s}"}, "skill"),
    "secret-name": lambda s: ({"secrets": [f"GH_TOKEN{s}"]}, "secrets"),
    "workspace": lambda s: ({"workspace_id": f"w{s}"}, "workspace_id"),
    "limits-key": lambda s: ({"limits": {f"memory_bytes{s}": 1}}, "limits"),
    "unknown-field": lambda s: ({f"extra{s}": [[1]]}, "extra"),
}


@pytest.mark.parametrize("field", RUN_FIELDS)
@pytest.mark.parametrize("surrogate", SURROGATES)
async def test_a_lone_surrogate_in_any_field_of_a_run_is_a_422_naming_it_and_no_run_is_stored(
        stack, surrogate, field):
    fields, named = RUN_FIELDS[field](SURROGATES[surrogate])
    async with raw_client(stack, new_team(stack, "team-a")) as http:
        answer = await http.post("/v1/runs", **as_json({"skill": "python-math", "command": "true", **fields}))
        refused(answer, named)
        assert (await http.get("/v1/runs")).json()["count"] == 0
    assert await stack.dispatcher.list() == []


@pytest.mark.parametrize("surrogate", SURROGATES)
async def test_a_lone_surrogate_in_a_library_registration_is_refused_and_the_team_has_no_library(stack, surrogate):
    s = SURROGATES[surrogate]
    async with raw_client(stack, new_team(stack, "team-a")) as http:
        for body, named in (({"name": f"lib{s}", "url": "http://127.0.0.1:9/l.tar.gz"}, "name"),
                            ({"name": "lib", "url": f"http://127.0.0.1:9/{s}/l.tar.gz"}, "url"),
                            ({"name": "lib", "url": "http://127.0.0.1:9/l.tar.gz", f"n{s}": {"x": [s]}}, "n")):
            refused(await http.post("/v1/libraries", **as_json(body)), named)
        refused(await http.put("/v1/libraries/lib/current", **as_json({"version": f"1{s}"})), "version")
        assert (await http.get("/v1/libraries")).json() == []
    assert stack.libraries.list("team-a") == []


@pytest.mark.parametrize("surrogate", SURROGATES)
async def test_a_lone_surrogate_in_a_paths_or_querys_bytes_is_never_a_500(stack, surrogate):
    """A URL's percent-escapes are bytes: those of a lone surrogate (``%ED%A0%80``) are not UTF-8, and are read as
    U+FFFD, which a store can keep; every route still answers them without a 500."""
    escaped = "".join(f"%{byte:02X}" for byte in SURROGATES[surrogate].encode("utf-8", "surrogatepass"))
    async with raw_client(stack, new_team(stack, "team-a")) as http:
        for method, url in (("GET", f"/v1/sessions/{escaped}"), ("GET", f"/v1/runs?status={escaped}"),
                            ("GET", f"/v1/skills?q={escaped}"), ("GET", f"/v1/libraries/{escaped}"),
                            ("POST", f"/v1/libraries/lib{escaped}/upload"), ("DELETE", f"/v1/secrets/X{escaped}"),
                            ("GET", f"/v1/runs/{escaped}")):
            answer = await http.request(method, url)
            assert answer.status_code < 500, (method, url, answer.status_code, answer.text[:200])
        assert (await http.get("/v1/runs")).json()["count"] == 0


# ---- the console's forms ----------------------------------------------------------------------------------------

def multipart_utf7(fields: dict[str, str]) -> dict[str, object]:
    """A form as multipart declaring ``charset=utf-7``, whose ``+2AA-`` the server decodes to a lone U+D800."""
    boundary = token_hex(8)
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
             for name, value in fields.items()]
    body = ("".join(parts) + f"--{boundary}--\r\n").encode("ascii")
    return {"content": body, "headers": {"content-type": f"multipart/form-data; boundary={boundary}; charset=utf-7"}}


UTF7_HIGH = "+2AA-"
"""U+D800 in UTF-7."""


async def test_a_console_form_holding_a_lone_surrogate_is_a_422_page_and_nothing_is_run_or_registered(console):
    browser = await console.browser("team-a")
    forms = [
        (f"/ui/skills/{SKILL}/run", {"command": f"echo {UTF7_HIGH}", "runtime": "local"}, "command"),
        (f"/ui/skills/{SKILL}/run", {"command": "true", "env": f"V=x{UTF7_HIGH}"}, "env"),
        ("/ui/libraries/register", {"name": "lib", "url": f"http://127.0.0.1:9/{UTF7_HIGH}.tar.gz"}, "url"),
        ("/ui/libraries/register", {"name": f"lib{UTF7_HIGH}", "url": "http://127.0.0.1:9/l.tar.gz"}, "name"),
    ]
    for url, fields, named in forms:
        answer = await browser.post(url, **multipart_utf7({"csrf": browser.csrf, **fields}))
        assert answer.status_code == 422, (url, fields, answer.status_code, answer.text[:300])
        assert named in answer.text and "lone surrogate" in answer.text, answer.text[:2000]
    assert await console.services.dispatcher.list() == []
    assert console.services.libraries.list("team-a") == []
    signing_in = console.client()
    login = await signing_in.get("/ui/login")
    answer = await signing_in.post("/ui/login", **multipart_utf7({"key": console.keys["team-a"],
                                                                  "csrf": csrf_of(login.text) + UTF7_HIGH}))
    assert answer.status_code == 422 and "csrf" in answer.text, (answer.status_code, answer.text[:300])
    assert "skillrun_session" not in signing_in.cookies


# ---- the MCP endpoint -------------------------------------------------------------------------------------------

MCP_ARGUMENTS = {
    "command": lambda s: ({"command": f"touch $WORK_DIR/ran{s}"}, "params.arguments.command"),
    "env-name": lambda s: ({"command": "touch $WORK_DIR/ran", "env": {f"V{s}": "x"}}, "params.arguments.env"),
    "deep-list": lambda s: ({"command": "touch $WORK_DIR/ran", "output_files": ["out/a", [[f"out/{s}"]]]},
                            "params.arguments.output_files.1.0.0"),
}


@pytest.mark.parametrize("where", MCP_ARGUMENTS)
async def test_mcp_a_lone_surrogate_in_a_tool_argument_is_invalid_params_naming_it_and_runs_nothing(api, where):
    alpha = api.key("alpha")
    session = api.open(alpha)
    for surrogate in SURROGATES.values():
        arguments, named = MCP_ARGUMENTS[where](surrogate)
        call = {"name": "skill_run", "arguments": {"skill": "notes", **arguments}}
        answer = api.post(alpha, session, {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": call})
        assert answer.status_code == 400, (where, answer.status_code, answer.text[:300])
        error = answer.json()
        assert error["id"] == 7 and error["error"]["code"] == INVALID_PARAMS, error
        assert named in error["error"]["message"] and "lone surrogate" in error["error"]["message"], error
    assert api.runs_of(alpha) == 0
    assert "ran" not in api.run(alpha, session, "ls $WORK_DIR")["stdout"]


# ---- the stores themselves (the second line) --------------------------------------------------------------------

@pytest.fixture(params=STACKS)
async def session_service(request, tmp_path):
    if request.param == "redis":
        service = RedisSessionService(request.getfixturevalue("redis_url"))
    else:
        service = InMemorySessionService() if request.param == "memory" else FileSessionService(tmp_path / "sessions")
    yield service
    await service.close()


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("surrogate", SURROGATES)
async def test_a_session_store_refuses_a_lone_surrogate_with_the_planes_error_and_keeps_nothing(
        session_service, surrogate, place):
    text = PLACES[place](SURROGATES[surrogate])
    with pytest.raises(UnencodableTextError, match="lone surrogate"):
        await session_service.create_session(app_name="app", user_id="team-a", session_id="bad", state=text)
    assert await session_service.get_session(app_name="app", user_id="team-a", session_id="bad") is None
    session = await session_service.create_session(app_name="app", user_id="team-a", session_id="s1")
    events = [Event(author="user", content=Content(parts=[Part.from_text(json.dumps(text, ensure_ascii=False))])),
              Event(author="agent")]
    events[1].actions.state_delta = text
    for event in events:
        with pytest.raises(UnencodableTextError, match="lone surrogate"):
            await session_service.append_event(session, event)
    stored = await session_service.get_session(app_name="app", user_id="team-a", session_id="s1")
    assert stored.events == [] and stored.state == {}


@pytest.fixture(params=["file", "redis"])
def documents(request, tmp_path):
    if request.param == "redis":
        built = RedisDocuments(request.getfixturevalue("redis_url"))
    else:
        built = FileDocuments(tmp_path / "registry")
    yield built
    built.close()


@pytest.mark.parametrize("surrogate", SURROGATES)
def test_the_registries_refuse_a_lone_surrogate_and_keep_nothing(documents, surrogate, tmp_path):
    s = SURROGATES[surrogate]
    with pytest.raises(UnencodableTextError, match="lone surrogate"):
        documents.put("libraries", "team-a.lib", {"team_id": "team-a", "versions": [{"source": [[f"upload:{s}"]]}]})
    assert documents.get("libraries", "team-a.lib") is None and documents.all("libraries") == []
    # What the operator sets from the command line (argv decoded with surrogateescape) is refused as such too
    with pytest.raises(TeamError):
        TeamStore(documents).create_team(f"team{s}")
    with pytest.raises(EgressListError):
        EgressStore(documents).set("team-a", [f"api{s}.example.org"])
    with pytest.raises(ValidationError):
        Quotas(documents, TeamQuota()).set("team-a", {"max_queued": f"1{s}"})
    assert [documents.all(kind) for kind in ("teams", "egress", "quotas")] == [[], [], []]


@pytest.fixture(params=["inline", "queue"])
async def dispatcher(request, work_root):
    if request.param == "queue":
        built = QueueDispatcher(request.getfixturevalue("redis_url"))
    else:
        built = InlineDispatcher({"local": LocalWorkspaceRuntime(work_root)})
    yield built
    await built.close()


@pytest.mark.parametrize("surrogate", SURROGATES)
async def test_a_dispatcher_refuses_a_run_holding_a_lone_surrogate_before_it_is_stored(dispatcher, surrogate):
    s = SURROGATES[surrogate]
    skill = SkillRef(name="python-math", root=str(LIBRARY), path="python-math")
    made = [RunRequest(skill=skill, command="true", env={"V": s}), RunRequest(skill=skill, command="true", cwd=s),
            RunRequest(skill=skill, command="true", output_files=["out/a", f"out/{s}"])]
    made.append(RunRequest(skill=skill, command="true"))
    made[-1].command = f"echo {s}"  # a caller's own request, changed after it was made
    for request in made:
        with pytest.raises(UnencodableTextError, match="lone surrogate") as caught:
            await dispatcher.submit(request, owner="team-a")
        assert caught.value.where.startswith("run."), caught.value.where
    assert await dispatcher.list() == []
