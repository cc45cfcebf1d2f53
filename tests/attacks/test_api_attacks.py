"""Attacks on the HTTP API and the CLI: oversized and non-finite requests, limits past the host, active content
served from the API's origin, terminal escapes from a run, and library URLs that reach the server's own network.

Each test runs the attack against the real application (its middleware, routes and fetcher) and asserts it is
refused with a 4xx that says why, or contained.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.api.limits import JSON_BODY_BYTES, RUN_BODY_BYTES, BodyLimitMiddleware
from orchestrator.libraries import LibraryRegistry
from tests.file_server import FileServer
from tests.orchestrator.api_helpers import client, new_team
from tests.orchestrator.test_api_teams import V1
from worker.egress.addresses import is_public
from worker.config import get_worker_settings
from worker.contract import RunLimits, RunRequest, SkillRef
from worker.errors import InvalidRunRequestError
from worker.validation import MAX_COMMAND_CHARS, validate_request

MiB = 1024 * 1024
OK = {"skill": "python-math", "command": "true"}


@pytest.fixture
async def api(services):
    async with client(services, new_team(services, "team-a")) as c:
        yield c


async def _nothing_queued(api) -> None:
    assert (await api.get("/v1/runs")).json()["count"] == 0


# ---- 1. every request bounded before it is read whole -----------------------------------------------------------

async def test_api_refuses_a_body_by_its_declared_length_without_reading_it():
    app_called = receive_called = False

    async def app(scope, receive, send):  # the API behind the middleware
        nonlocal app_called
        app_called = True

    async def receive():
        nonlocal receive_called
        receive_called = True
        return {"type": "http.request", "body": b"", "more_body": False}

    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/sessions",
             "headers": [(b"content-length", str(400 * MiB).encode())]}
    await BodyLimitMiddleware(app)(scope, receive, send)
    assert sent[0]["status"] == 413 and not app_called and not receive_called
    assert f"at most {JSON_BODY_BYTES} bytes" in json.loads(sent[1]["body"])["detail"]


async def test_api_refuses_a_chunked_400_mb_body_once_it_passes_the_limit(api):
    chunks_sent = 0

    async def body():  # chunked: no Content-Length to go by
        nonlocal chunks_sent
        yield b'{"session_id": "s", "state": {"x": "'
        for _ in range(400):
            chunks_sent += 1
            yield b"a" * MiB
        yield b'"}}'

    response = await api.post("/v1/sessions", content=body(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert f"at most {JSON_BODY_BYTES} bytes" in response.json()["detail"]
    assert chunks_sent <= JSON_BODY_BYTES // MiB + 2  # the rest was never read
    assert (await api.get("/v1/sessions/s")).status_code == 404


async def test_api_refuses_a_100_mb_command_before_reading_it(api):
    response = await api.post("/v1/runs", json={**OK, "command": "x" * (100 * MiB)})
    assert response.status_code == 413 and f"at most {RUN_BODY_BYTES} bytes" in response.json()["detail"]
    await _nothing_queued(api)


@pytest.mark.parametrize(("fields", "where"), [
    ({"command": "x" * (MAX_COMMAND_CHARS + 1)}, "command"),
    ({"command": "echo before\u0000echo after"}, "command"),
    ({"env": {f"V{i}": "x" for i in range(65)}}, "env"),
    ({"env": {"V" * 129: "x"}}, "env"),
    ({"env": {"V": "x" * 4097}}, "env"),
    ({"output_files": ["out/x"] * 65}, "output_files"),
    ({"output_files": ["out/" + "x" * 1024]}, "output_files"),
    ({"cwd": "x" * 1025}, "cwd"),
    ({"inputs": [{"name": f"f{i}", "content": ""} for i in range(65)]}, "inputs"),
    ({"inputs": [{"name": "x" * 1025, "content": ""}]}, "inputs"),
    ({"workspace_id": "w" * 32}, "workspace_id"),
    ({"skill": "s" * 65}, "skill"),
])
async def test_api_refuses_fields_over_their_bounds_and_names_them(api, fields, where):
    response = await api.post("/v1/runs", json={**OK, **fields})
    assert response.status_code == 422 and where in response.json()["detail"]
    await _nothing_queued(api)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_api_answers_a_non_finite_timeout_with_a_422_naming_it(api, number):
    body = json.dumps(OK)[:-1] + f', "timeout": {number}}}'
    response = await api.post("/v1/runs", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert "timeout" in response.json()["detail"] and "finite" in response.json()["detail"]
    await _nothing_queued(api)


@pytest.fixture
def ceilings(monkeypatch):
    """Set ``SKILLRUN_MAX_*`` for the test; the settings are read again after it."""
    def set_(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"SKILLRUN_{name.upper()}", value)
        get_worker_settings.cache_clear()

    yield set_
    get_worker_settings.cache_clear()


@pytest.mark.parametrize(("fields", "where"), [
    ({"limits": {"memory_bytes": 64 * 1024**3}}, "limits.memory_bytes"),  # more than this host has (default)
    ({"limits": {"processes": 65536}}, "limits.processes"),
    ({"limits": {"cpu_seconds": 7200}}, "limits.cpu_seconds"),
    ({"timeout": 601}, "timeout"),
])
async def test_limits_above_the_operator_ceilings_are_refused_by_the_api_and_the_worker(
    services, ceilings, fields, where
):
    ceilings(max_cpu_seconds="3600", max_timeout_seconds="600")
    if where == "limits.memory_bytes":
        assert get_worker_settings().max_memory_bytes < 64 * 1024**3, "this test needs a host under 64 GiB"
    async with client(services, new_team(services, "team-a")) as api:
        document = (await api.get("/openapi.json")).json()["components"]["schemas"]
        owner, _, name = where.rpartition(".")
        declared = document["RunLimits" if owner else "RunCreate"]["properties"][name]["maximum"]
        assert declared < (fields["limits"][name] if owner else fields[name])  # the document tells the ceiling
        response = await api.post("/v1/runs", json={**OK, **fields})
        assert response.status_code == 422 and response.json()["detail"].startswith(f"{where}:")
        await _nothing_queued(api)
    request = RunRequest(skill=SkillRef(name="python-math", root="/nowhere"), command="true",
                         **{k: RunLimits(**v) if k == "limits" else v for k, v in fields.items()})
    with pytest.raises(InvalidRunRequestError) as refused:
        validate_request(request)  # as a worker does before running
    assert refused.value.field == where


# ---- 3. served files cannot run on the API's origin; run output cannot drive the operator's terminal ------------

ACTIVE = {"page.html": "<html><script>alert(1)</script></html>", "pic.svg": '<svg xmlns="http://www.w3.org/2000/svg">'
          '<script>alert(1)</script></svg>', "feed.xml": '<?xml version="1.0"?><a/>'}


async def test_served_files_are_never_sniffed_and_active_types_are_downloads(api):
    writes = "; ".join(f"printf %s {json.dumps(text)} > out/{name}" for name, text in ACTIVE.items())
    run = (await api.post("/v1/runs", json={**OK, "command": f"{writes}; printf 'a,b\\n' > out/t.csv",
                                            "output_files": ["out/*"], "save_as_artifacts": True})).json()
    done = (await api.get(f"/v1/runs/{run['id']}", params={"wait": 30})).json()
    assert done["status"] == "finished", done
    for kind in ("files", "artifacts"):
        for name in ACTIVE:
            served = await api.get(f"/v1/runs/{run['id']}/{kind}/out/{name}")
            assert served.status_code == 200 and served.headers["x-content-type-options"] == "nosniff"
            assert served.headers["content-disposition"].startswith("attachment;"), (name, served.headers)
        passive = await api.get(f"/v1/runs/{run['id']}/{kind}/out/t.csv")
        assert passive.headers["x-content-type-options"] == "nosniff"
        assert passive.headers["content-disposition"].startswith("inline;")


ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m"


def _cli_in_a_terminal(args: list[str], cwd: Path) -> bytes:
    """Run the CLI with a pseudo-terminal as its stdout and stderr, as an operator's shell would; what it wrote."""
    primary, secondary = os.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKILLRUN_", "SKILLS_"))}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], stdout=secondary, stderr=secondary,
                            stdin=subprocess.DEVNULL, cwd=cwd, env=env)
    os.close(secondary)
    output = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal's other side closed
            break
        if not chunk:
            break
        output += chunk
    proc.wait(timeout=60)
    os.close(primary)
    return output


def test_the_cli_shows_a_runs_terminal_escapes_escaped_and_keeps_json_valid(library, work_root):
    command = f"printf '{ESCAPES}out\\n'; printf '{ESCAPES}err' >&2; touch \"out/$(printf 'n\\033[2Jame')\""
    args = ["run", "demo", command, "-o", "out/*", "--skills-root", str(library), "--work-root", str(work_root)]
    shown = _cli_in_a_terminal(args, work_root)
    assert b"\x1b" not in shown and "\x9b".encode() not in shown, shown
    assert shown.count(b"\\x1b]0;owned\\x07\\x1b[2J\\x9b31m") == 2 and b"n\\x1b[2Jame" in shown
    printed = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args, "--json"], capture_output=True,
                             cwd=work_root, timeout=60)
    result = json.loads(printed.stdout)  # still valid JSON, and still the run's own bytes
    assert result["stdout"] == f"{ESCAPES}out\n" and b"\x1b" not in printed.stdout and b"\xc2\x9b" not in printed.stdout


# ---- 4. library URLs cannot reach the server's own network --------------------------------------------------------

@pytest.fixture
def inside():
    """A server on the API host's loopback: what a hostile library URL tries to reach."""
    srv = FileServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def refusing(services, tmp_path):
    services.libraries = LibraryRegistry(services.teams.docs, tmp_path / "libraries")  # the default: refuse
    return services


@pytest.mark.parametrize("host", [
    "0177.0.0.1", "2130706433", "0x7f.1", "127.1", "[::ffff:127.0.0.1]", "[::127.0.0.1]", "[64:ff9b::7f00:1]",
    "[64:ff9b:1::1]", "[2002:7f00:1::]", "[2001:0:4136:e378:8000:63bf:3fff:fdd2]", "[::1]", "localhost",
])
async def test_library_urls_spelling_loopback_any_way_are_refused_with_a_4xx(refusing, inside, host):
    port = inside.port
    inside.add("/lib.tar.gz", V1)
    async with client(refusing, new_team(refusing, "team-a")) as api:
        response = await api.post("/v1/libraries", json={"name": "lib", "url": f"http://{host}:{port}/lib.tar.gz"})
    detail = response.json()["detail"]
    assert response.status_code == 422 and ("private or local address" in detail or "Invalid IPv4" in detail), detail
    assert inside.hits == {}


@pytest.mark.parametrize(("address", "public"), [
    ("8.8.8.8", True), ("::ffff:8.8.8.8", True), ("64:ff9b::808:808", True), ("2002:808:808::1", True),
    ("2606:4700::1111", True), ("::ffff:10.0.0.1", False), ("::10.0.0.1", False), ("64:ff9b::a9fe:a9fe", False),
    ("2002:c0a8:101::1", False), ("2002:a9fe:a9fe::", False), ("2001::1", False), ("64:ff9b:1::808:808", False),
    ("fe80::1", False), ("fc00::1", False), ("169.254.169.254", False), ("100.64.0.1", False), ("::", False),
])
def test_ipv6_spellings_of_private_ipv4_are_private_and_public_ones_stay_public(address, public):
    assert is_public(ipaddress.ip_address(address)) is public


PUBLIC = "93.184.215.14"


@pytest.fixture
def network(monkeypatch, inside):
    """A stand-in for the internet: ``files.example`` resolves to a public address first and to 127.0.0.1 after
    (DNS rebinding); a connection to the public address reaches ``outside``, every other goes where it says."""
    outside = FileServer().start()
    lookups = []
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.create_connection

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "files.example":
            return real_getaddrinfo(host, port, *args, **kwargs)
        lookups.append(host)
        address = PUBLIC if len(lookups) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]

    def create_connection(address, *args, **kwargs):
        if address[0] == PUBLIC:
            address = ("127.0.0.1", outside.port)
        return real_connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    yield outside
    outside.stop()


async def test_a_library_host_that_rebinds_to_loopback_is_fetched_from_the_address_that_was_vetted(
    refusing, inside, network
):
    port = inside.port  # the URL names the inside server's port: a rebind would reach it
    inside.add("/lib.tar.gz", V1)
    network.add("/lib.tar.gz", V1)
    async with client(refusing, new_team(refusing, "team-a")) as api:
        response = await api.post("/v1/libraries", json={"name": "lib", "url": f"http://files.example:{port}/lib.tar.gz"})
    assert response.status_code == 201, response.text
    assert network.hits == {"/lib.tar.gz": 1} and inside.hits == {}


async def test_a_library_host_with_any_private_address_is_refused(refusing, inside, monkeypatch):
    def getaddrinfo(host, port, *args, **kwargs):  # a public address first, loopback second
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, port)) for a in (PUBLIC, "127.0.0.1")]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    inside.add("/lib.tar.gz", V1)
    async with client(refusing, new_team(refusing, "team-a")) as api:
        url = f"http://files.example:{inside.port}/lib.tar.gz"
        response = await api.post("/v1/libraries", json={"name": "lib", "url": url})
    assert response.status_code == 422 and "private or local address (127.0.0.1)" in response.json()["detail"]
    assert inside.hits == {}


async def test_a_redirect_from_a_public_library_host_to_loopback_is_refused(refusing, inside, network):
    inside.add("/secret.tar.gz", V1)
    network.add("/lib.tar.gz", b"", status=302, headers={"Location": inside.url("/secret.tar.gz")})
    async with client(refusing, new_team(refusing, "team-a")) as api:
        response = await api.post("/v1/libraries", json={"name": "lib", "url": "http://files.example/lib.tar.gz"})
    assert response.status_code == 422 and "private or local address" in response.json()["detail"]
    assert network.hits == {"/lib.tar.gz": 1} and inside.hits == {}
