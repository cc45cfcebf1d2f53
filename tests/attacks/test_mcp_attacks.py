"""Attacks on Skillrun as an MCP server: the API's ``/mcp`` (streamable HTTP behind the team's key, runs in this
process on the local runtime) and ``skillrun mcp`` over stdio (the real command, as an MCP client starts it).

Each test runs the attack for real — raw HTTP or raw protocol lines where a well-behaved client would refuse to
send it — and asserts it is contained, and that nothing else was touched. An attack that gets through today is
written as the safe behaviour and marked ``xfail(strict=True)`` with what gets through as its reason, so closing
the hole turns its test into a failure (drop the mark then).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
import queue
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from orchestrator.config import get_settings
from orchestrator.dispatch import InlineDispatcher, QueueDispatcher
from orchestrator.skills import create_default_skill_repository
from tests.conftest import IS_ROOT, workspace_dirs, write_skill
from tests.integration.conftest import worker_env, workers  # noqa: F401 - fixtures
from tests.orchestrator.api_helpers import api_in_a_thread, make_services, new_team
from tests.processes import _within, alive, running_with, sleeper, wait_gone, wait_none_with
from worker.artifacts import FileArtifactStore
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

REPO = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
PROTOCOL = "2025-06-18"
ACCEPT = "application/json, text/event-stream"
FILE_CAP = 4096
"""SKILLRUN_MCP_OUTPUT_FILE_BYTES of every server here."""
TOTAL_CAP = 10_000
"""SKILLRUN_MCP_OUTPUT_TOTAL_BYTES of every server here."""
MAX_SESSIONS = 4
"""SKILLRUN_MCP_MAX_SESSIONS of the API here."""
TEAM_SESSIONS = 3
"""SKILLRUN_MCP_MAX_SESSIONS_PER_TEAM of the API here."""
WORKSPACE_LIMIT = 2
"""SKILLRUN_MAX_WORKSPACES_PER_TEAM of the API here."""
RESOURCE_NOT_FOUND = -32002
INVALID_PARAMS = -32602
HANG_GUARD = 60.0
"""Seconds a wait may take before the test says what never happened (a guard against hangs, not a measure)."""


def initialize(request_id: int | str = 1) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": "initialize",
            "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                       "clientInfo": {"name": "attacker", "version": "1"}}}


def readable_tree(root: Path) -> None:
    """Folders 0755 and files 0644 (links left alone: chmod would follow them), as a library the workspace users
    can read but not change."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


def tree_digest(root: Path) -> str:
    """Every entry below ``root`` (links as links): names, kinds, modes and contents."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest.update(f"{path.relative_to(root)}:{info.st_mode}:".encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@dataclass
class Secrets:
    """Host files a run or a client must never see: a world-readable canary outside every workspace and library
    (a folder of it too), its text."""

    folder: Path
    file: Path
    text: str


@pytest.fixture
def secrets(shared_dir: Path) -> Secrets:
    folder = shared_dir / "host-secret"
    folder.mkdir()
    folder.chmod(0o755)
    text = f"CANARY-{uuid.uuid4().hex}"
    file = folder / "secret.md"
    file.write_text(text + "\n")
    file.chmod(0o644)
    return Secrets(folder, file, text)


@pytest.fixture
def server_library(shared_dir: Path, secrets: Secrets) -> Path:
    """The server's own library: plain skills, and ``leaky``, whose folder links to the host's secrets (as a git
    clone of a skill repository may: git keeps symlinks)."""
    root = shared_dir / "library"
    write_skill(root, "notes", "Take notes.\n", {"docs/usage.md": "# Usage\nWrite notes.\n"})
    write_skill(root, "files", "Write files.\n")
    leaky = write_skill(root, "leaky", "Looks harmless.\n", {"docs/real.md": "A real doc.\n"})
    (leaky / "notes.md").symlink_to(secrets.file)  # a doc that is a link to a host file
    (leaky / "refs").symlink_to(secrets.folder, target_is_directory=True)  # a folder of docs that is a link out
    readable_tree(root)
    return root


# ---- the API's /mcp ---------------------------------------------------------------------------------------------

class Api:
    """The API in a thread of this process, spoken to as raw HTTP (what a hostile client sends, not what the SDK's
    client would)."""

    def __init__(self, url: str, services, work_root: Path) -> None:
        self.url = f"{url}/mcp"
        self.base = url
        self.port = int(url.rsplit(":", 1)[1])
        self.services = services
        self.work_root = work_root

    def key(self, team: str) -> str:
        return new_team(self.services, team)

    @staticmethod
    def headers(key: str | None, session: str | None = None, **extra: str) -> dict[str, str]:
        headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        if session is not None:
            headers["mcp-session-id"] = session
            headers["mcp-protocol-version"] = PROTOCOL
        return {**headers, **extra}

    def open(self, key: str) -> str:
        """A new MCP session of ``key``'s team (initialize, then initialized); its id."""
        answer = httpx.post(self.url, headers=self.headers(key), json=initialize(), timeout=HANG_GUARD)
        assert answer.status_code == 200, answer.text
        session = answer.headers["mcp-session-id"]
        note = self.post(key, session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert note.status_code == 202, note.text
        return session

    def post(self, key: str | None, session: str | None, message: dict | bytes, **headers: str) -> httpx.Response:
        body = message if isinstance(message, bytes) else json.dumps(message).encode()
        return httpx.post(self.url, headers=self.headers(key, session, **headers), content=body, timeout=HANG_GUARD)

    def rpc(self, key: str, session: str, method: str, params: dict | None = None) -> dict:
        """One request on a session: its JSON-RPC answer (``result`` or ``error``)."""
        message = {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": method}
        if params is not None:
            message["params"] = params
        answer = self.post(key, session, message)
        assert answer.status_code == 200, (answer.status_code, answer.text)
        return answer.json()

    def tool(self, key: str, session: str, name: str, arguments: dict) -> dict:
        """A tool call's ``CallToolResult`` (as JSON)."""
        answer = self.rpc(key, session, "tools/call", {"name": name, "arguments": arguments})
        assert "result" in answer, answer
        return answer["result"]

    def run(self, key: str, session: str, command: str, skill: str = "notes", **arguments) -> dict:
        """``skill_run`` of ``skill``; its summary (asserted not an error)."""
        result = self.tool(key, session, "skill_run", {"skill": skill, "command": command, **arguments})
        assert not result.get("isError"), result
        return result["structuredContent"]

    def delete(self, key: str | None, session: str) -> httpx.Response:
        return httpx.delete(self.url, headers=self.headers(key, session), timeout=HANG_GUARD)

    def runs_of(self, key: str) -> int:
        listed = httpx.get(f"{self.base}/v1/runs", headers={"Authorization": f"Bearer {key}"}, timeout=HANG_GUARD)
        return listed.json()["count"]

    def alive(self, key: str) -> bool:
        """The endpoint still opens a session and answers a ping on it."""
        session = self.open(key)
        answered = "result" in self.rpc(key, session, "ping")
        self.delete(key, session)
        return answered


@pytest.fixture
async def start_api(work_root: Path, server_library: Path, monkeypatch):
    """Starts the API (the embedded default: inline runs on the local runtime, ``server_library`` as the server's
    library) with this file's MCP bounds; stopped, and its services closed, after the test."""
    stack = contextlib.ExitStack()
    made = []

    def start(*, idle_seconds: float = 900, workspace_limit: int = WORKSPACE_LIMIT,
              redis_url: str | None = None) -> Api:
        for name, value in {"SKILLRUN_MCP_OUTPUT_FILE_BYTES": FILE_CAP, "SKILLRUN_MCP_OUTPUT_TOTAL_BYTES": TOTAL_CAP,
                            "SKILLRUN_MCP_MAX_SESSIONS": MAX_SESSIONS,
                            "SKILLRUN_MCP_MAX_SESSIONS_PER_TEAM": TEAM_SESSIONS,
                            "SKILLRUN_MCP_SESSION_IDLE_SECONDS": idle_seconds}.items():
            monkeypatch.setenv(name, str(value))
        get_settings.cache_clear()
        if redis_url is None:  # the embedded default
            runtime = LocalWorkspaceRuntime(work_root)
            dispatcher = InlineDispatcher({"local": runtime}, workspace_limit=workspace_limit)
            artifacts = runtime.artifact_store
        else:  # runs go through Redis to worker processes
            dispatcher = QueueDispatcher(redis_url, workspace_limit=workspace_limit)
            artifacts = FileArtifactStore(work_root.parent / "artifacts")
        services = make_services(dispatcher, artifacts, work_root.parent / "data")
        services.repository = create_default_skill_repository(str(server_library))
        made.append(services)
        return Api(stack.enter_context(api_in_a_thread(services)), services, work_root)

    start.stack = stack
    yield start
    stack.close()
    for services in made:
        await services.close()
    get_settings.cache_clear()


@pytest.fixture
def api(start_api) -> Api:
    return start_api()


def library_archive(skill: str, text: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = f"---\nname: {skill}\ndescription: Only one team has this.\n---\n{text}\n".encode()
        info = tarfile.TarInfo(f"{skill}/SKILL.md")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def give_private_library(api: Api, team: str, shared_dir: Path) -> str:
    """``team`` gets a library of its own with skill ``<team>-secret``, whose SKILL.md says a secret; the secret."""
    secret = f"{team}-steps-{uuid.uuid4().hex}"
    archive = shared_dir / f"{team}.tar.gz"
    archive.write_bytes(library_archive(f"{team}-secret", secret))
    api.services.libraries.add_from_file(team, "private", archive)
    return secret


# ---- 1. teams and keys --------------------------------------------------------------------------------------------

async def test_mcp_answers_401_to_missing_malformed_wrong_and_revoked_keys_on_post_get_and_delete(api):
    api.services.teams.create_team("alpha")
    key_record, key = api.services.teams.create_key("alpha")
    session = api.open(key)
    api.run(key, session, "echo kept > $WORK_DIR/state.txt")
    refused = {"missing": None, "basic": "Basic " + base64.b64encode(key.encode()).decode(), "empty": "Bearer",
               "wrong": "Bearer sr_nope_nope", "twice": f"Bearer {key} {key}", "no scheme": key,
               "another scheme": f"Token {key}", "prefix": f"Bearer {key[:-1]}"}
    for label, authorization in refused.items():
        headers = Api.headers(None, session)
        if authorization is not None:
            headers["Authorization"] = authorization
        for method in ("POST", "GET", "DELETE"):
            answer = httpx.request(method, api.url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}
                                   if method == "POST" else None, timeout=HANG_GUARD)
            assert answer.status_code == 401, (label, method, answer.status_code, answer.text)
            assert answer.headers["www-authenticate"] == "Bearer"
    api.services.teams.revoke_key(key_record.id)
    for method in ("POST", "GET", "DELETE"):
        answer = httpx.request(method, api.url, headers=Api.headers(key, session),
                               json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"} if method == "POST" else None,
                               timeout=HANG_GUARD)
        assert answer.status_code == 401 and "invalid or revoked" in answer.json()["detail"], (method, answer.text)
    assert httpx.post(api.url, headers=Api.headers(key), json=initialize(), timeout=HANG_GUARD).status_code == 401
    # None of the refused requests touched the session: a fresh key of the team still finds its workspace
    fresh = api.key("alpha")
    assert api.run(fresh, session, "cat $WORK_DIR/state.txt")["stdout"] == "kept\n"
    assert len(workspace_dirs(api.work_root)) == 1


async def test_mcp_a_foreign_key_on_a_session_sees_only_its_own_library_runs_and_workspaces(api, shared_dir):
    alpha, beta = api.key("alpha"), api.key("beta")
    secret = give_private_library(api, "alpha", shared_dir)
    session = api.open(alpha)
    assert api.run(alpha, session, "echo alpha-was-here", skill="alpha-secret")["stdout"] == "alpha-was-here\n"
    # beta, holding alpha's session id, looks through it: every request is answered as if there were no session
    for method, params in (("resources/list", {}), ("resources/read", {"uri": "skill://alpha-secret/SKILL.md"}),
                           ("tools/list", {}), ("tools/call", {"name": "skill_load",
                                                              "arguments": {"skill_name": "alpha-secret"}})):
        answer = api.post(beta, session, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        assert answer.status_code == 404 and secret not in answer.text and "alpha-secret" not in answer.text, method
    # beta's own views of runs and workspaces show nothing of alpha's
    beta_v1 = {"Authorization": f"Bearer {beta}"}
    assert httpx.get(f"{api.base}/v1/runs", headers=beta_v1).json()["count"] == 0
    assert httpx.get(f"{api.base}/v1/workspaces", headers=beta_v1).json()["count"] == 0
    assert api.runs_of(alpha) == 1


async def test_mcp_a_session_refuses_another_teams_tool_call_even_before_its_owner_called_a_tool(api):
    alpha, beta = api.key("alpha"), api.key("beta")
    session = api.open(alpha)
    api.rpc(alpha, session, "tools/list", {})  # what a client does first: list, no call yet
    api.rpc(alpha, session, "resources/list", {})
    hijack = api.post(beta, session, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                      "params": {"name": "skill_run", "arguments": {"skill": "notes",
                                                                                    "command": "echo hijacked"}}})
    mine = api.tool(alpha, session, "skill_list", {})
    assert hijack.status_code == 404 and "Session not found" in hijack.text  # as if there were no such session
    assert not mine.get("isError"), mine


async def test_mcp_another_teams_delete_does_not_end_a_session(api):
    alpha, beta = api.key("alpha"), api.key("beta")
    session = api.open(alpha)
    api.run(alpha, session, "echo kept > $WORK_DIR/state.txt")
    deleted = api.delete(beta, session)
    assert deleted.status_code in (403, 404), deleted.status_code
    assert api.run(alpha, session, "cat $WORK_DIR/state.txt")["stdout"] == "kept\n"


async def test_mcp_another_team_cannot_open_a_sessions_event_stream(api):
    alpha, beta = api.key("alpha"), api.key("beta")
    session = api.open(alpha)
    headers = Api.headers(beta, session)
    headers["Accept"] = "text/event-stream"
    with httpx.stream("GET", api.url, headers=headers, timeout=HANG_GUARD) as stream:
        status = stream.status_code
    assert status in (403, 404), status


# ---- 2. resources -----------------------------------------------------------------------------------------------

TRAVERSALS = [
    "skill://notes/../../../../etc/passwd", "skill://notes/..%2f..%2f..%2f..%2fetc%2fpasswd",
    "skill://notes/%2e%2e/%2e%2e/%2e%2e/etc/passwd", "skill://notes/%2fetc%2fpasswd", "skill://notes//etc/passwd",
    "skill://notes/docs/../../../etc/passwd", "skill://notes/docs%2f..%2f..%2fSKILL.md", "skill://../SKILL.md",
    "skill://%2e%2e/SKILL.md", "skill://..%2f..%2fetc/passwd", "skill:///etc/passwd", "skill://notes",
    "skill://notes/", "skill://notes/SKILL.md?x=1", "skill://notes/SKILL.md#frag", "skill://notes%00/SKILL.md",
    "skill://notes/SKILL.md%00.md", "skill://notes:80@files/SKILL.md", "skill://NOTES/SKILL.md",
    "file:///etc/passwd", "http://127.0.0.1:9/", "skillrun://workspace/out/x", "skill://overview/../notes/SKILL.md",
    "skill://notes/scripts", "skill://leaky/notes.md/../../../host-secret/secret.md", "skill://beta-secret/SKILL.md",
    "skill://" + "a" * 100_000 + "/SKILL.md",
]


async def test_mcp_resources_refuse_traversal_encoded_slashes_other_schemes_and_other_teams_skills(
    api, shared_dir, secrets
):
    alpha, beta = api.key("alpha"), api.key("beta")
    beta_secret = give_private_library(api, "beta", shared_dir)
    session = api.open(alpha)
    readable = api.rpc(alpha, session, "resources/read", {"uri": "skill://notes/docs/usage.md"})
    assert readable["result"]["contents"][0]["text"] == "# Usage\nWrite notes.\n"
    for uri in TRAVERSALS:
        answer = api.rpc(alpha, session, "resources/read", {"uri": uri})
        assert "error" in answer and answer["error"]["code"] in (RESOURCE_NOT_FOUND, INVALID_PARAMS), (uri[:80], answer)
        text = json.dumps(answer)
        assert "root:x:0:0" not in text and secrets.text not in text and beta_secret not in text, uri[:80]
    # and the other way round: beta's own library is beta's, alpha's key reads none of it through beta's session
    beta_session = api.open(beta)
    own = api.rpc(beta, beta_session, "resources/read", {"uri": "skill://beta-secret/SKILL.md"})
    assert beta_secret in json.dumps(own)
    foreign = api.post(alpha, beta_session, {"jsonrpc": "2.0", "id": 1, "method": "resources/read",
                                              "params": {"uri": "skill://beta-secret/SKILL.md"}})
    assert foreign.status_code == 404 and beta_secret not in foreign.text  # another team's session: none for alpha
    assert api.alive(beta)


async def test_mcp_resource_cursors_that_are_bogus_or_huge_are_refused_or_an_empty_page(api):
    alpha = api.key("alpha")
    session = api.open(alpha)
    for cursor in ["abc", "-1", "1e3", "", " 1", "1 ", "0x10", "9" * 10, "9" * 100_000, "1" * 4300 + "0", "Ⅻ", "½"]:
        answer = api.rpc(alpha, session, "resources/list", {"cursor": cursor})
        assert answer.get("error", {}).get("code") == INVALID_PARAMS, (cursor[:40], answer)
        assert "invalid cursor" in answer["error"]["message"]
    far = api.rpc(alpha, session, "resources/list", {"cursor": "999999999"})
    assert far["result"]["resources"] == [] and "nextCursor" not in far["result"]
    assert api.rpc(alpha, session, "resources/list", {"cursor": 5})["error"]["code"] == INVALID_PARAMS
    assert api.alive(alpha)


async def test_mcp_a_superscript_digit_cursor_is_an_invalid_params_error(api):
    alpha = api.key("alpha")
    session = api.open(alpha)
    answer = api.rpc(alpha, session, "resources/list", {"cursor": "²"})
    assert answer["error"]["code"] == INVALID_PARAMS and "invalid cursor" in answer["error"]["message"], answer


# ---- 3. runs ------------------------------------------------------------------------------------------------------

async def test_mcp_runs_never_reach_another_sessions_workspace_the_library_or_the_servers_stores(
    api, shared_dir, secrets, server_library
):
    alpha, beta = api.key("alpha"), api.key("beta")
    library_before = tree_digest(server_library)
    first = api.open(alpha)
    canary = f"WS-CANARY-{uuid.uuid4().hex}"
    api.run(alpha, first, f"echo {canary} > $WORK_DIR/canary.txt; echo {canary} > $OUTPUT_DIR/canary.txt")
    [first_dir] = workspace_dirs(api.work_root)
    data_dir = shared_dir / "data"
    assert any(data_dir.rglob("*")), "the server's stores hold something to protect"
    key_hashes = [hashlib.sha256(key[len("sr_") + 13:].encode()).hexdigest() for key in (alpha, beta)]
    probes = (
        f"cat {first_dir}/work/canary.txt {first_dir}/out/canary.txt; ls {first_dir} {api.work_root} {shared_dir}; "
        f"ls -R {data_dir} | head; cat {secrets.file}; ls $WORKSPACE_DIR/.. $WORKSPACE_DIR/../..; "
        f"cat $WORKSPACE_DIR/../*/work/canary.txt; cat /proc/1/root{first_dir}/work/canary.txt; "
        f"find / -name 'canary*' -not -path '/proc/*' 2>/dev/null; grep -rs {canary} /tmp /dev/shm /run; "
        f"for f in SKILL.md docs/usage.md; do echo tampered >> $f; done; touch new-file; chmod 777 . ; "
        f"echo tampered > $SKILLS_DIR/files/SKILL.md; rm -rf $SKILLS_DIR/notes/docs; "
        f"(exec 3<>/dev/tcp/127.0.0.1/{api.port} && echo reached-the-api) 2>&1; true"
    )
    for key in (alpha, beta):  # another session of the same team, and another team's
        session = api.open(key)
        result = api.tool(key, session, "skill_run", {"skill": "notes", "command": probes})
        text = json.dumps(result)
        assert canary not in text and secrets.text not in text, text[:2000]
        assert not any(hashed in text for hashed in key_hashes), "a key's hash from the server's store"
        assert "No such file or directory" in result["structuredContent"]["stderr"]
        assert "reached-the-api" not in result["structuredContent"]["stdout"]
        api.delete(key, session)
    assert api.run(alpha, first, "cat $WORK_DIR/canary.txt")["stdout"] == f"{canary}\n"  # untouched
    assert tree_digest(server_library) == library_before  # the library is read-only to runs
    assert secrets.file.read_text() == secrets.text + "\n"


async def test_mcp_links_in_out_to_host_files_or_another_workspace_are_skipped_never_returned(
    api, secrets
):
    alpha = api.key("alpha")
    other = api.open(alpha)
    canary = f"WS-CANARY-{uuid.uuid4().hex}"
    api.run(alpha, other, f"echo {canary} > $WORK_DIR/canary.txt")
    [other_dir] = workspace_dirs(api.work_root)
    session = api.open(alpha)
    links = {
        "passwd": "/etc/passwd", "secret": str(secrets.file), "folder": str(secrets.folder), "root": "/",
        "other": f"{other_dir}/work/canary.txt", "climb": "../" * 12 + str(secrets.file).lstrip("/"),
        "proc": f"/proc/1/root{secrets.file}", "self": f"/proc/self/root{secrets.file}", "loop": "loop",
    }
    command = "; ".join(f"ln -s '{target}' $OUTPUT_DIR/{name}" for name, target in links.items())
    command += (f"; mkdir $OUTPUT_DIR/d; ln -s {secrets.folder} $OUTPUT_DIR/d/inner; echo ok > $OUTPUT_DIR/real.txt"
                "; ln /etc/shadow $OUTPUT_DIR/hard-shadow; ln /etc/passwd $OUTPUT_DIR/hard-passwd; true")
    # As root the test reads the shadow file's first line to look for it; a normal account cannot (nor can its run).
    shadow = Path("/etc/shadow").read_text().splitlines()[0] if IS_ROOT else None
    answer = api.post(alpha, session, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "skill_run", "arguments": {"skill": "notes", "command": command,
                                           "output_files": ["out/*", "out/**/*", "$OUTPUT_DIR/d/inner/*"]}}})
    assert answer.status_code == 200
    raw = answer.text
    assert secrets.text not in raw and canary not in raw and "root:x:0:0" not in raw
    assert shadow is None or shadow not in raw
    result = answer.json()["result"]
    assert not result.get("isError"), raw[:2000]
    returned = [block["_meta"]["skillrun/file"]["name"] for block in result["content"][1:]]
    assert returned == ["out/real.txt"]
    skipped = {entry["name"] for entry in result["structuredContent"]["skipped_files"]}
    assert {f"out/{name}" for name in ("passwd", "secret", "folder", "other", "climb", "proc")} <= skipped, skipped
    assert secrets.file.read_text() == secrets.text + "\n"


async def test_mcp_output_files_come_back_within_the_per_file_and_total_caps(api):
    alpha = api.key("alpha")
    session = api.open(alpha)
    command = ("head -c 1048576 /dev/zero | tr '\\0' a > $OUTPUT_DIR/big.txt; "
               "for i in 1 2 3 4 5 6; do head -c 3000 /dev/zero | tr '\\0' b > $OUTPUT_DIR/t$i.txt; done; "
               "head -c 100000 /dev/urandom > $OUTPUT_DIR/blob.bin; "
               "(printf x; for i in $(seq 3000); do printf '\\303\\251'; done) > $OUTPUT_DIR/utf8.txt; "
               "head -c 20000000 /dev/urandom > $OUTPUT_DIR/huge.bin")
    answer = api.post(alpha, session, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "skill_run", "arguments": {"skill": "notes", "command": command, "output_files": ["out/*"]}}})
    assert answer.status_code == 200
    result = answer.json()["result"]
    assert not result.get("isError"), answer.text[:2000]
    files = {f["name"]: f for f in result["structuredContent"]["output_files"]}
    assert files["out/big.txt"]["truncated"] and files["out/big.txt"]["size"] == MiB
    total = 0
    for block in result["content"][1:]:
        if block["type"] == "text":
            size = len(block["text"].encode("utf-8", "surrogateescape"))
        elif block["type"] == "image":
            size = len(base64.b64decode(block["data"]))
        else:
            size = len(base64.b64decode(block["resource"]["blob"]))
        assert size <= FILE_CAP, (block["_meta"], size)
        total += size
    assert total <= TOTAL_CAP, total
    # The whole answer stays near the caps: the files' bytes (base64 at worst) and a small summary
    assert len(answer.content) < TOTAL_CAP * 4 // 3 + 64 * 1024, len(answer.content)


async def test_mcp_the_whole_answer_stays_near_the_caps_whatever_out_holds(api):
    alpha = api.key("alpha")
    session = api.open(alpha)
    command = "cd $OUTPUT_DIR && seq 20000 | sed 's/^/" + "n" * 200 + "/' | xargs touch"
    answer = api.post(alpha, session, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "skill_run", "arguments": {"skill": "notes", "command": command, "output_files": ["out/*"]}}})
    assert answer.status_code == 200 and not answer.json()["result"].get("isError")
    assert len(answer.content) < 2 * MiB, len(answer.content)


async def test_mcp_output_globs_that_leave_the_workspace_are_refused_before_the_command_runs(api, secrets):
    alpha = api.key("alpha")
    other = api.open(alpha)
    api.run(alpha, other, "echo x > $WORK_DIR/canary.txt")
    [other_dir] = workspace_dirs(api.work_root)
    session = api.open(alpha)
    api.run(alpha, session, "true")
    patterns = ["/etc/passwd", "../../../etc/passwd", "$WORKSPACE_DIR/../*", "out/../../../*", f"{other_dir}/work/*",
                "$OUTPUT_DIR/../../**/*", str(secrets.file), "${WORKSPACE_DIR}/../../*", "out/{a,../../..}/*"]
    for index, pattern in enumerate(patterns):
        result = api.tool(alpha, session, "skill_run", {"skill": "notes", "command": f"touch $WORK_DIR/ran-{index}",
                                                         "output_files": [pattern]})
        assert result.get("isError") and "output_files" in result["content"][0]["text"], (pattern, result)
        assert secrets.text not in json.dumps(result)
    assert "ran-" not in api.run(alpha, session, "ls $WORK_DIR")["stdout"]  # none of those commands ran


# ---- 4. sessions that end -----------------------------------------------------------------------------------------

async def _post_in_background(
    api: Api, key: str, session: str, arguments: dict
) -> tuple[asyncio.Task, httpx.AsyncClient]:
    """A skill_run call going on in a task (and its client, to close)."""
    client = httpx.AsyncClient(timeout=HANG_GUARD * 2)
    message = {"jsonrpc": "2.0", "id": 77, "method": "tools/call",
               "params": {"name": "skill_run", "arguments": arguments}}
    task = asyncio.create_task(client.post(api.url, headers=Api.headers(key, session), json=message))
    return task, client


async def test_mcp_delete_mid_run_cancels_the_run_kills_what_it_detached_and_removes_the_workspace(api):
    alpha = api.key("alpha")
    session = api.open(alpha)
    daemon, daemon_arg = sleeper()
    api.run(alpha, session, f"(setsid {daemon} > /dev/null 2>&1 &); nohup {daemon} > /dev/null 2>&1 & echo started")
    command, argument = sleeper()
    arguments = {"skill": "notes", "command": f"{daemon} & {command}"}
    call, client = await _post_in_background(api, alpha, session, arguments)
    async with client:
        assert await asyncio.to_thread(_within, 30, lambda: bool(running_with(argument))), "the run never started"
        assert api.delete(alpha, session).status_code == 200
        await asyncio.wait_for(call, HANG_GUARD)  # answered, not left hanging
    assert await asyncio.to_thread(wait_none_with, argument, 15)
    assert await asyncio.to_thread(wait_none_with, daemon_arg, 15)
    assert await asyncio.to_thread(_within, 15, lambda: workspace_dirs(api.work_root) == [])
    assert api.post(alpha, session, {"jsonrpc": "2.0", "id": 2, "method": "ping"}).status_code == 404  # ended


async def test_mcp_a_call_cut_short_by_its_sessions_delete_is_not_answered_500(api):
    alpha = api.key("alpha")
    session = api.open(alpha)
    command, argument = sleeper()
    call, client = await _post_in_background(api, alpha, session, {"skill": "notes", "command": command})
    async with client:
        assert await asyncio.to_thread(_within, 30, lambda: bool(running_with(argument))), "the run never started"
        assert api.delete(alpha, session).status_code == 200
        answer = await asyncio.wait_for(call, HANG_GUARD)
    assert await asyncio.to_thread(wait_none_with, argument, 15)
    assert answer.status_code == 404 and "session ended" in answer.json()["error"]["message"], answer.text


async def test_mcp_an_idle_session_is_ended_and_its_workspace_removed(start_api, work_root):
    api = start_api(idle_seconds=1)
    alpha = api.key("alpha")
    session = api.open(alpha)
    api.run(alpha, session, "echo kept > $WORK_DIR/state.txt")
    assert len(workspace_dirs(work_root)) == 1
    assert await asyncio.to_thread(_within, 15, lambda: workspace_dirs(work_root) == [])
    assert api.post(alpha, session, {"jsonrpc": "2.0", "id": 2, "method": "ping"}).status_code == 404


async def test_mcp_stopping_the_api_mid_run_ends_the_run_and_removes_the_workspace(start_api, work_root):
    api = start_api()
    alpha = api.key("alpha")
    session = api.open(alpha)
    command, argument = sleeper()
    call, client = await _post_in_background(api, alpha, session, {"skill": "notes", "command": command})
    async with client:
        assert await asyncio.to_thread(_within, 30, lambda: bool(running_with(argument))), "the run never started"
        await asyncio.to_thread(start_api.stack.close)  # the server stops (its graceful shutdown, then its lifespan)
        with contextlib.suppress(httpx.HTTPError):
            await asyncio.wait_for(call, HANG_GUARD)
    assert await asyncio.to_thread(wait_none_with, argument, 15)
    assert await asyncio.to_thread(_within, 15, lambda: workspace_dirs(work_root) == [])


@pytest.mark.xfail(strict=True, reason=(
    "an HTTP client that disconnects mid-call, without DELETE, leaves its run going until the run's own timeout (up"
    " to 24 h): the SDK's JSON-response handler keeps waiting for the run, so the request stays 'in flight' and the"
    " session never counts as idle (SKILLRUN_MCP_SESSION_IDLE_SECONDS does not end it); nothing watches for the"
    " client's disconnect"))
async def test_mcp_a_client_that_disconnects_mid_run_has_its_run_ended_once_the_session_idles(start_api):
    api = start_api(idle_seconds=1)
    alpha = api.key("alpha")
    session = api.open(alpha)
    command, argument = sleeper()
    call, client = await _post_in_background(api, alpha, session, {"skill": "notes", "command": command, "timeout": 40})
    try:
        assert await asyncio.to_thread(_within, 30, lambda: bool(running_with(argument))), "the run never started"
        call.cancel()  # the client goes away: its connection is closed, no DELETE
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await call
        await client.aclose()
        gone = await asyncio.to_thread(wait_none_with, argument, 6)
    finally:
        for pid in running_with(argument):  # leave nothing behind whatever the outcome
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
    assert gone


async def test_mcp_through_the_queue_delete_mid_run_cancels_it_at_the_worker_and_removes_the_workspace(
    start_api, redis_url, workers, work_root, secrets
):
    workers.start()
    api = start_api(redis_url=redis_url)
    alpha = api.key("alpha")
    session = api.open(alpha)
    escape = api.run(alpha, session, f"cat {secrets.file} {work_root}/*/work/* 2>&1; ls {work_root.parent} 2>&1; true")
    assert secrets.text not in json.dumps(escape) and "No such file or directory" in escape["stdout"]
    command, argument = sleeper()
    call, client = await _post_in_background(api, alpha, session, {"skill": "notes", "command": command})
    async with client:
        assert await asyncio.to_thread(_within, 30, lambda: bool(running_with(argument))), "the run never started"
        assert api.delete(alpha, session).status_code == 200
        await asyncio.wait_for(call, HANG_GUARD)
    assert await asyncio.to_thread(wait_none_with, argument, 15)
    assert await asyncio.to_thread(_within, 20, lambda: workspace_dirs(work_root) == [])

    def statuses() -> set[str]:
        listed = httpx.get(f"{api.base}/v1/runs", headers={"Authorization": f"Bearer {alpha}"}, timeout=HANG_GUARD)
        return {run["status"] for run in listed.json()["data"]}

    assert await asyncio.to_thread(_within, 15, lambda: statuses() == {"finished", "cancelled"}), statuses()


# ---- 5. bounds ----------------------------------------------------------------------------------------------------

async def test_mcp_refuses_bodies_over_4_mib_declared_or_chunked_with_413_and_keeps_the_session(api):
    alpha = api.key("alpha")
    session = api.open(alpha)
    big = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "skill_run", "arguments": {"skill": "notes", "command": "x" * (5 * MiB)}}}).encode()
    declared = api.post(alpha, session, big)
    assert declared.status_code == 413, declared.text[:200]

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 64 * 1024):
            yield big[start:start + 64 * 1024]

    chunked = httpx.post(api.url, headers=Api.headers(alpha, session), content=chunks(), timeout=HANG_GUARD)
    assert chunked.status_code == 413, chunked.text[:200]
    unauthenticated = httpx.post(api.url, headers=Api.headers(None), content=chunks(), timeout=HANG_GUARD)
    assert unauthenticated.status_code in (401, 413)
    assert "result" in api.rpc(alpha, session, "ping")
    assert api.runs_of(alpha) == 0


MALFORMED = [
    b"not json", b"", b"[]", b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', b"{}", b"null", b'"ping"', b"5",
    b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', b'{"jsonrpc": "2.0", "id": 1, "method": 5}',
    b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}', b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "no/such/method"}', b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call"}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": "x"}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": 5}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "skill_run", "arguments": [1, 2]}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "skill_run", "arguments": "rm -rf /"}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "../../bin/sh", "arguments": {}}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": 5}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "not a uri"}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", "params": {"uri": "skill://notes/SKILL.md"}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "prompts/list"}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "logging/setLevel", "params": {"level": "debug"}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}',
    b'{"jsonrpc": "2.0", "id": 1, "result": {}}', b'{"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "x"}}',
    b'{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "nope"}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"_meta": {"progressToken": [1, 2]}}}',
]


async def test_mcp_malformed_json_rpc_gets_4xx_or_json_rpc_errors_never_a_500_and_runs_nothing(api):
    alpha = api.key("alpha")
    session = api.open(alpha)
    for body in MALFORMED:
        answer = api.post(alpha, session, body)
        assert answer.status_code < 500, (body[:80], answer.status_code, answer.text[:300])
    # A tools/call sent as a notification (no id) is not run
    note = api.post(alpha, session, {"jsonrpc": "2.0", "method": "tools/call", "params": {
        "name": "skill_run", "arguments": {"skill": "notes", "command": "touch $WORK_DIR/notified"}}})
    assert note.status_code < 500
    bad_headers = [{"Content-Type": "text/plain"}, {"Accept": "text/html"}, {"mcp-protocol-version": "1999-01-01"},
                   {"mcp-session-id": "0" * 32}, {"mcp-session-id": "x" * 10_000}, {"mcp-session-id": "../" * 20}]
    for headers in bad_headers:
        answer = api.post(alpha, session, {"jsonrpc": "2.0", "id": 9, "method": "ping"}, **headers)
        assert 400 <= answer.status_code < 500, (headers, answer.status_code)
    for method in ("PUT", "PATCH", "OPTIONS"):
        assert httpx.request(method, api.url, headers=Api.headers(alpha, session)).status_code < 500
    assert httpx.get(api.url, headers=Api.headers(alpha)).status_code < 500  # a stream without a session
    assert "result" in api.rpc(alpha, session, "ping")
    assert api.runs_of(alpha) == 0
    assert "notified" not in api.run(alpha, session, "ls $WORK_DIR")["stdout"]


@pytest.mark.parametrize("body", [
    b"[" * 200_000,
    b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "\xff\xfe"}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": ' + b"9" * 5000 + b"}}",
], ids=["deep-nesting", "not-utf8", "5000-digit-number"])
async def test_mcp_a_body_json_cannot_decode_is_a_400_not_a_500(api, body):
    alpha = api.key("alpha")
    session = api.open(alpha)
    answer = api.post(alpha, session, body)
    assert "result" in api.rpc(alpha, session, "ping")
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text[:200])


BAD_ARGUMENTS = [
    ('"timeout": 1e308', "timeout"), ('"timeout": 1000000000000000000000000000000', "timeout"),
    ('"timeout": -1', "timeout"), ('"timeout": 0', "timeout"), ('"timeout": "soon"', "timeout"),
    ('"timeout": []', "timeout"), ('"timeout": 86401', "timeout"),
    ('"env": {"LD_PRELOAD": "/tmp/x.so"}', "LD_PRELOAD"), ('"env": {"BASH_ENV": "/tmp/x"}', "BASH_ENV"),
    ('"env": {"WORK_DIR": "/"}', "WORK_DIR"), ('"env": {"A=B": "x"}', "env"), ('"env": {"X": "a\\u0000b"}', "env"),
    ('"env": ["X"]', "env"), ('"env": {"X": 5}', "env"), ('"env": {"X": "' + "v" * MiB + '"}', "env"),
    ('"env": {' + ", ".join(f'"V{i}": "x"' for i in range(1000)) + "}", "env"),
    ('"output_files": "out/*"', "output_files"),
    ('"output_files": [' + ", ".join(['"out/*"'] * 500) + "]", "output_files"),
    ('"output_files": ["' + "a" * 10_000 + '"]', "output_files"), ('"workspace_id": "alpha.other"', "unexpected"),
    ('"runtime": "docker"', "unexpected"), ('"tool_context": {}', "unexpected"),
    ('"limits": {"cpu_seconds": 1}', "unexpected"),
    ('"inputs": [{"name": "x", "host_path": "/etc/shadow"}]', "unexpected"), ('"network": true', "unexpected"),
]


async def test_mcp_bad_skill_run_arguments_are_error_results_naming_the_problem(api, secrets):
    alpha = api.key("alpha")
    session = api.open(alpha)
    for fragment, named in BAD_ARGUMENTS:
        body = ('{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "skill_run", "arguments": '
                '{"skill": "notes", "command": "touch $WORK_DIR/ran", ' + fragment + "}}}").encode()
        answer = api.post(alpha, session, body)
        assert answer.status_code == 200, (fragment[:60], answer.status_code)
        result = answer.json()["result"]
        assert result.get("isError") and named in result["content"][0]["text"], (fragment[:60], result)
    commands = [("x" * (200 * 1024), "command"), ("", "command"), ("a\u0000b", "NUL character")]
    for command, named in commands:
        result = api.tool(alpha, session, "skill_run", {"skill": "notes", "command": command})
        assert result.get("isError") and named in result["content"][0]["text"], (command[:20], result)
    for skill in ["../../etc", "/etc", "x" * 100_000, "NOTES", "notes/../files", 5, None]:
        result = api.tool(alpha, session, "skill_run", {"skill": skill, "command": "touch $WORK_DIR/ran"})
        assert result.get("isError"), (str(skill)[:20], result)
    assert "ran" not in api.run(alpha, session, "ls $WORK_DIR")["stdout"]  # not one of them ran
    assert api.alive(alpha)


async def test_mcp_a_non_finite_timeout_is_refused_not_run_with_the_default(api):
    # The SDK would pass NaN, Infinity or 1e999 on as null, and the run would go ahead with the default timeout.
    alpha = api.key("alpha")
    session = api.open(alpha)
    for number in ("NaN", "Infinity", "-Infinity", "1e999"):
        body = ('{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "skill_run", "arguments": '
                '{"skill": "notes", "command": "touch $WORK_DIR/ran-' + number + '", '
                '"timeout": ' + number + "}}}").encode()
        answer = api.post(alpha, session, body)
        error = answer.json()["error"]
        assert answer.status_code == 400 and error["code"] == -32700, (number, answer.text)
        assert f"{number} is not a finite number" in error["message"], (number, error)
    assert "ran" not in api.run(alpha, session, "ls $WORK_DIR")["stdout"]


async def test_mcp_an_invalid_run_is_refused_before_it_is_recorded(api):
    alpha = api.key("alpha")
    session = api.open(alpha)
    result = api.tool(alpha, session, "skill_run", {"skill": "notes", "command": "x" * (3 * MiB)})
    assert result.get("isError") and "command" in result["content"][0]["text"]
    assert api.runs_of(alpha) == 0


async def test_mcp_one_session_past_the_cap_is_refused_with_503_and_room_frees_when_one_ends(api):
    alpha, beta = api.key("alpha"), api.key("beta")
    sessions = [api.open(alpha) for _ in range(TEAM_SESSIONS)] + [api.open(beta)]  # every slot taken
    refused = httpx.post(api.url, headers=Api.headers(beta), json=initialize(), timeout=HANG_GUARD)
    assert refused.status_code == 503 and "mcp-session-id" not in refused.headers
    for session in sessions[:TEAM_SESSIONS]:  # the open ones are unaffected
        assert "result" in api.rpc(alpha, session, "ping")
    assert api.delete(alpha, sessions.pop(0)).status_code == 200
    sessions.append(api.open(beta))
    assert httpx.post(api.url, headers=Api.headers(beta), json=initialize(), timeout=HANG_GUARD).status_code == 503


async def test_mcp_one_team_cannot_hold_every_session_and_lock_the_others_out(api):
    alpha, beta = api.key("alpha"), api.key("beta")
    for _ in range(TEAM_SESSIONS):
        api.open(alpha)
    more = httpx.post(api.url, headers=Api.headers(alpha), json=initialize(), timeout=HANG_GUARD)
    assert more.status_code == 429 and "MCP sessions open" in more.json()["detail"] and "Retry-After" in more.headers
    answer = httpx.post(api.url, headers=Api.headers(beta), json=initialize(), timeout=HANG_GUARD)
    assert answer.status_code == 200, (answer.status_code, answer.text)


async def test_mcp_sessions_past_the_teams_workspace_cap_get_a_clean_error_and_other_teams_still_run(api):
    alpha, beta = api.key("alpha"), api.key("beta")
    sessions = [api.open(alpha) for _ in range(WORKSPACE_LIMIT + 1)]
    for session in sessions[:WORKSPACE_LIMIT]:
        api.run(alpha, session, "echo mine > $WORK_DIR/m.txt")
    refused = api.tool(alpha, sessions[-1], "skill_run", {"skill": "notes", "command": "echo one-too-many"})
    assert refused.get("isError") and "SKILLRUN_MAX_WORKSPACES_PER_TEAM" in refused["content"][0]["text"], refused
    assert "one-too-many" not in json.dumps(refused)
    assert len(workspace_dirs(api.work_root)) == WORKSPACE_LIMIT
    # another team is not held back by alpha's limit
    beta_session = api.open(beta)
    assert api.run(beta, beta_session, "echo beta")["stdout"] == "beta\n"
    api.delete(beta, beta_session)
    # alpha's open sessions keep their workspaces; one closed, the refused session runs
    for session in sessions[:WORKSPACE_LIMIT]:
        assert api.run(alpha, session, "cat $WORK_DIR/m.txt")["stdout"] == "mine\n"
    assert api.delete(alpha, sessions[0]).status_code == 200
    assert await asyncio.to_thread(_within, 15, lambda: len(workspace_dirs(api.work_root)) == WORKSPACE_LIMIT - 1)
    assert api.run(alpha, sessions[-1], "echo now")["stdout"] == "now\n"
    for session in sessions[1:]:
        api.delete(alpha, session)
    assert await asyncio.to_thread(_within, 15, lambda: workspace_dirs(api.work_root) == [])


async def test_mcp_another_team_is_served_while_one_team_floods_the_endpoint(api):
    alpha, beta = api.key("alpha"), api.key("beta")
    beta_session = api.open(beta)
    flood_session = api.open(alpha)
    messages = [
        {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
        for i, (method, params) in enumerate([("tools/list", {}), ("resources/list", {}),
                                              ("resources/read", {"uri": "skill://notes/../../etc/passwd"}),
                                              ("tools/call", {"name": "skill_list", "arguments": {}}),
                                              ("tools/call", {"name": "skill_run", "arguments": {
                                                  "skill": "notes", "command": "echo flood"}}),
                                              ("no/such", {})] * 40)
    ]
    limits = httpx.Limits(max_connections=300, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=HANG_GUARD * 2, limits=limits) as client:
        flood = [client.post(api.url, headers=Api.headers(alpha, flood_session), json=m) for m in messages]
        flood += [client.post(api.url, headers=Api.headers(alpha), json=initialize()) for _ in range(40)]
        flood += [client.post(api.url, headers=Api.headers(alpha, flood_session), content=b"garbage")
                  for _ in range(40)]
        flooding = asyncio.gather(*flood, return_exceptions=True)
        served = await asyncio.to_thread(api.tool, beta, beta_session, "skill_run",
                                         {"skill": "notes", "command": "echo served"})
        answers = await flooding
    assert not served.get("isError") and served["structuredContent"]["stdout"] == "served\n"
    statuses = [a.status_code if isinstance(a, httpx.Response) else repr(a) for a in answers]
    assert all(isinstance(s, int) and (s < 500 or s == 503) for s in statuses), statuses
    assert "result" in api.rpc(beta, beta_session, "ping")


# ---- 6. stdio (skillrun mcp) --------------------------------------------------------------------------------------

@pytest.fixture
def stdio_env(work_root: Path, shared_dir: Path) -> dict[str, str]:
    return {**os.environ, "SKILLRUN_WORK_ROOT": str(work_root), "SKILLRUN_ARTIFACTS_DIR": str(shared_dir / "artifacts"),
            "SKILLRUN_DATA_DIR": str(shared_dir / "data"), "SKILLRUN_MCP_OUTPUT_FILE_BYTES": str(FILE_CAP),
            "SKILLRUN_MCP_OUTPUT_TOTAL_BYTES": str(TOTAL_CAP), "PYTHONPATH": str(REPO)}


class Stdio:
    """``skillrun mcp`` as a child process, spoken to in raw lines; every line it writes to stdout must be a JSON
    message (logs go to stderr)."""

    def __init__(self, library: Path, env: dict[str, str], stderr: Path) -> None:
        self._stderr = open(stderr, "wb")  # noqa: SIM115 - closed in close()
        self.stderr_path = stderr
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "mcp", "--skills-root", str(library)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
                                     cwd=str(REPO))
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.not_json: list[bytes] = []
        self.notifications: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, request_id: int, method: str, params: dict | None = None) -> dict:
        message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(json.dumps(message).encode() + b"\n")
        return self.answer(request_id)

    def answer(self, request_id: int) -> dict:
        deadline = time.monotonic() + HANG_GUARD
        while True:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, f"the server closed stdout; stderr: {self.stderr_path.read_text()[-2000:]}"
            try:
                message = json.loads(line)
            except ValueError:
                self.not_json.append(line)
                continue
            if message.get("id") == request_id and ("result" in message or "error" in message):
                return message
            self.notifications.append(message)

    def initialize(self) -> None:
        assert "result" in self.request(0, "initialize", initialize()["params"])
        self.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')

    def tool(self, request_id: int, name: str, arguments: dict) -> dict:
        answer = self.request(request_id, "tools/call", {"name": name, "arguments": arguments})
        assert "result" in answer, answer
        return answer["result"]

    def exited(self, seconds: float = HANG_GUARD) -> int | None:
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self._stderr.close()


@pytest.fixture
def stdio(server_library: Path, stdio_env: dict[str, str], shared_dir: Path):
    started: list[Stdio] = []

    def start() -> Stdio:
        server = Stdio(server_library, stdio_env, shared_dir / f"stderr-{len(started)}.txt")
        started.append(server)
        server.initialize()
        return server

    yield start
    for server in started:
        server.close()


async def test_stdio_a_doc_linked_to_a_host_file_is_neither_listed_read_nor_loaded(stdio, secrets):
    server = stdio()
    listed = server.request(1, "resources/list", {})
    read = server.request(2, "resources/read", {"uri": "skill://leaky/notes.md"})
    loaded = server.tool(3, "skill_load", {"skill_name": "leaky", "docs": ["notes.md"]})
    listed_docs = server.tool(4, "skill_list_docs", {"skill_name": "leaky"})
    seen = json.dumps([listed, read, loaded, listed_docs])
    assert secrets.text not in seen
    assert "skill://leaky/notes.md" not in json.dumps(listed)


async def test_stdio_links_out_of_a_skill_folder_reach_nothing_from_a_run_and_runs_cannot_change_the_library(
    stdio, secrets, server_library, work_root
):
    library_before = tree_digest(server_library)
    server = stdio()
    listed = json.dumps(server.request(1, "resources/list", {}))
    assert "skill://leaky/docs/real.md" in listed and "refs/" not in listed  # a linked folder is not walked
    for request_id, uri in enumerate(["skill://leaky/refs/secret.md", "skill://leaky/refs%2fsecret.md",
                                      "skill://leaky/../host-secret/secret.md"], start=10):
        answer = server.request(request_id, "resources/read", {"uri": uri})
        assert answer["error"]["code"] == RESOURCE_NOT_FOUND and secrets.text not in json.dumps(answer), uri
    run = server.tool(20, "skill_run", {
        "skill": "leaky", "output_files": ["notes.md", "refs/*", "out/*"],
        "command": (f"cat notes.md refs/secret.md {secrets.file}; cp notes.md refs/secret.md $OUTPUT_DIR/; "
                    "echo tampered >> SKILL.md; echo tampered > docs/real.md; touch planted.md; "
                    "ln -s /etc/passwd evil.md; true")})
    assert secrets.text not in json.dumps(run)
    assert "No such file or directory" in run["structuredContent"]["stderr"]
    assert tree_digest(server_library) == library_before
    server.proc.stdin.close()
    assert server.exited() == 0
    assert await asyncio.to_thread(_within, 15, lambda: workspace_dirs(work_root) == [])


async def test_stdio_garbage_lines_get_errors_and_the_session_keeps_serving_on_a_clean_stdout(stdio):
    server = stdio()
    garbage = [b"garbage", b"", b"{}", b"[]", b"null", b'{"jsonrpc": "2.0"}', b"\x00\x01\x02", b"\xff\xfe\xfd",
               b"[" * 100_000, b'{"jsonrpc": "2.0", "id": 5, "method": "ping", "params": {"x": ' + b"9" * 5000 + b"}}",
               b'{"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "skill_run", "arguments": '
               b'{"skill": "notes", "command": "true", "timeout": NaN}}}',
               b'{"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "skill_run", "arguments": '
               b'{"skill": "notes", "command": "touch $WORK_DIR/notified"}}}',
               b'{"jsonrpc": "2.0", "id": 7, "result": {}}', b"\r\n", b" " * MiB, "é€😀".encode() * 1000]
    for line in garbage:
        server.send(line + b"\n")
    unknown = server.request(8, "no/such/method", {})
    assert unknown["error"]["code"] in (-32601, INVALID_PARAMS)
    assert "result" in server.request(9, "ping")
    ran = server.tool(10, "skill_run", {"skill": "notes", "command": "ls $WORK_DIR"})
    assert not ran.get("isError")
    assert "notified" not in ran["structuredContent"]["stdout"]  # a tools/call sent as a notification ran nothing
    assert server.proc.poll() is None
    assert server.not_json == []  # stdout carries the protocol only


async def test_stdio_a_line_past_64_mib_ends_the_session_removes_its_workspace_and_the_server_exits(stdio, work_root):
    server = stdio()
    assert not server.tool(1, "skill_run", {"skill": "notes", "command": "echo kept > $WORK_DIR/k"}).get("isError")
    assert len(workspace_dirs(work_root)) == 1

    def flood() -> None:
        chunk = b"x" * MiB
        with contextlib.suppress(BrokenPipeError, OSError):
            for _ in range(80):  # 80 MiB without a newline
                server.send(chunk)

    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    assert server.exited() == 0, "the server kept reading past its line limit"
    writer.join(HANG_GUARD)
    assert await asyncio.to_thread(_within, 15, lambda: workspace_dirs(work_root) == [])
    assert "longer than" in server.stderr_path.read_text()


async def test_stdio_closing_stdin_mid_run_ends_the_run_what_it_detached_and_the_workspace(stdio, work_root):
    server = stdio()
    daemon, daemon_arg = sleeper()
    command, argument = sleeper()
    server.send(json.dumps(detaching_call(daemon, command)).encode() + b"\n")
    assert await asyncio.to_thread(_within, 30, lambda: bool(running_with(argument))), "the run never started"
    server.proc.stdin.close()
    assert await asyncio.to_thread(server.exited) == 0, "the server outlived its client"
    assert await asyncio.to_thread(wait_none_with, argument, 15)
    assert await asyncio.to_thread(wait_none_with, daemon_arg, 15)
    assert await asyncio.to_thread(_within, 15, lambda: workspace_dirs(work_root) == [])


def detaching_call(daemon: str, command: str) -> dict:
    """A skill_run that leaves ``daemon`` running twice (a new session, nohup) and waits in ``command``."""
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "skill_run", "arguments": {
        "skill": "notes",
        "command": f"(setsid {daemon} > /dev/null 2>&1 &); nohup {daemon} >/dev/null 2>&1 & {command}"}}}


CLIENT = """
import json, subprocess, sys, time
server = subprocess.Popen(sys.argv[2:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
messages = json.loads(sys.argv[1])
for message in messages:
    server.stdin.write(json.dumps(message).encode() + b"\\n")
    server.stdin.flush()
    if message.get("method") == "initialize":
        server.stdout.readline()
print(server.pid, flush=True)
time.sleep(600)
"""
"""An MCP client that starts ``skillrun mcp``, sends its messages, says the server's pid and waits to be killed."""


async def test_stdio_a_client_killed_mid_run_leaves_nothing_running_and_no_workspace(
    server_library, stdio_env, work_root, shared_dir
):
    daemon, daemon_arg = sleeper()
    command, argument = sleeper()
    messages = [initialize(0), {"jsonrpc": "2.0", "method": "notifications/initialized"},
                detaching_call(daemon, command)]
    with open(shared_dir / "client-stderr.txt", "wb") as stderr:
        client = subprocess.Popen([sys.executable, "-c", CLIENT, json.dumps(messages), sys.executable, "-m",
                                   "orchestrator.cli", "mcp", "--skills-root", str(server_library)],
                                  stdout=subprocess.PIPE, stderr=stderr, env=stdio_env, cwd=str(REPO))
    server_pid = None
    try:
        server_pid = int(await asyncio.to_thread(client.stdout.readline))
        assert await asyncio.to_thread(_within, 30, lambda: bool(running_with(argument))), "the run never started"
        client.kill()  # both of the server's pipes lose their other end at once
        client.wait()
        assert await asyncio.to_thread(wait_gone, server_pid, HANG_GUARD), "the server outlived its client"
        assert await asyncio.to_thread(wait_none_with, argument, 15)
        assert await asyncio.to_thread(wait_none_with, daemon_arg, 15)
        assert await asyncio.to_thread(_within, 15, lambda: workspace_dirs(work_root) == [])
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        client.stdout.close()
        if server_pid is not None and alive(server_pid):
            os.kill(server_pid, 9)
