"""Runs with an egress allow-list (``RunRequest.egress``) on the local runtime (as root) and the Docker runtime: the
allowed host is reached through the worker's proxy, and nothing else is — not other hosts, not raw addresses, not
a resolver, not the worker's loopback — and each refusal is counted and listed in the result. The Cube runtime
refuses such a run.

The "public" host is a server of the test's on the host's loopback (plain HTTP, and HTTPS for tunnels, which must
carry TLS), its name pinned to that address with the operator's ``SKILLRUN_EGRESS_PINNED_HOSTS`` (meant for tests
and private deployments; without it a name must resolve to public addresses). No traffic leaves the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.dispatch import QueueDispatcher
from orchestrator.egress import EgressStore
from orchestrator.skills import create_default_skill_repository
from tests.conftest import write_skill
from tests.egress_hosts import ALLOWED
from tests.egress_tls import Origin, tls_origin  # noqa: F401 - the allowed host's server
from tests.integration.conftest import (  # noqa: F401 - shared fixtures
    cube_runtime_factory,
    cube_standin,
    docker_engine,
    docker_runtime_factory,
)
from tests.integration.test_mcp_http import mcp_session
from tests.orchestrator.api_helpers import api_in_a_thread, make_services, new_team
from worker.artifacts import FileArtifactStore
from worker.contract import RunRequest, RuntimeName, SkillRef
from worker.errors import InvalidRunRequestError
from worker.run_store import RunStatus
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

PROBE = r'''
import json, os, socket, ssl, sys, urllib.request
port = int(sys.argv[1])
proxy = ("127.0.0.1", 3128)
found = {}

def connect(target):
    with socket.create_connection(proxy, timeout=10) as s:
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = s.recv(4096).decode("latin-1")
        status = head.split(" ")[1] if " " in head else head
        if status == "200":
            with ssl._create_unverified_context().wrap_socket(s, server_hostname=target.rsplit(":", 1)[0]) as tls:
                tls.sendall(f"GET /tunnel HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode())
                body = b""
                while chunk := tls.recv(65536):
                    body += chunk
            return "200 " + body.decode().split("\r\n\r\n", 1)[-1]
        return status

def attempt(name, call):
    try:
        found[name] = call()
    except Exception as exc:
        found[name] = "error " + type(exc).__name__

attempt("get", lambda: urllib.request.urlopen(f"http://ALLOWED:{port}/plain", timeout=10).read().decode())
attempt("connect", lambda: connect(f"ALLOWED:{port}"))
attempt("connect_refused_host", lambda: connect("refused.example.org:443"))
attempt("connect_raw_ip", lambda: connect("1.1.1.1:443"))
attempt("connect_loopback_ip", lambda: connect(f"127.0.0.1:{port}"))
attempt("connect_other_port", lambda: connect(f"ALLOWED:{port + 1}"))
attempt("direct_server", lambda: socket.create_connection(("127.0.0.1", port), timeout=5) and "connected")
attempt("direct_ip", lambda: socket.create_connection(("1.1.1.1", 443), timeout=5) and "connected")
attempt("dns_resolve", lambda: socket.getaddrinfo("example.org", 443))
attempt("dns_tcp", lambda: socket.create_connection(("8.8.8.8", 53), timeout=5) and "connected")

def dns_udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03org\x00\x00\x01\x00\x01", ("8.8.8.8", 53))
    return s.recv(512)
attempt("dns_udp", dns_udp)

def loopback_ports():
    open_ports = []
    for other in (22, 53, 80, 443, 3127, 3129, 6379, 8080, 9000, port):
        try:
            socket.create_connection(("127.0.0.1", other), timeout=2).close()
            open_ports.append(other)
        except OSError:
            pass
    return open_ports
attempt("loopback_ports", loopback_ports)
attempt("proxy_admin", lambda: urllib.request.urlopen(
    urllib.request.Request("http://127.0.0.1:3128/", method="GET"), timeout=5).read().decode())
found["env"] = {k: v for k, v in os.environ.items() if k.lower().endswith("_proxy")}
print(json.dumps(found))
'''.replace("ALLOWED", ALLOWED)


@pytest.fixture
def allowed_server(tls_origin: Origin) -> int:
    """The allowed host's port: plain HTTP and, for tunnels, HTTPS."""
    return tls_origin.port


@pytest.fixture
def probe_skill(shared_dir):
    root = shared_dir / "egress-library"
    write_skill(root, "probe", files={"probe.py": PROBE})
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return SkillRef(name="probe", root=str(root), path="probe")


def _request(skill: SkillRef, port: int, **fields) -> RunRequest:
    return RunRequest(skill=skill, command=f"python3 probe.py {port}", egress=[f"{ALLOWED}:{port}"], timeout=120,
                      **fields)


def _check_contained(result, port: int) -> None:
    assert result.exit_code == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["get"] == "reached /plain"
    assert found["connect"] == "200 reached /tunnel over TLS"
    for name in ("connect_refused_host", "connect_raw_ip", "connect_loopback_ip", "connect_other_port"):
        assert found[name] == "403", (name, found)
    for name in ("direct_server", "direct_ip", "dns_resolve", "dns_tcp", "dns_udp"):
        assert found[name].startswith("error"), (name, found)
    assert found["loopback_ports"] == []  # nothing but the proxy listens there: no admin port, not the worker's
    assert found["proxy_admin"].startswith("error HTTPError")  # a request to the proxy itself is refused (403)
    assert found["env"]["HTTPS_PROXY"] == found["env"]["https_proxy"] == "http://127.0.0.1:3128"
    listed = {refusal.destination: refusal.reason for refusal in result.egress_refusals}
    assert result.egress_refused == len(result.egress_refusals) == 5, listed
    assert listed["refused.example.org:443"] == "refused.example.org:443 is not on the allow-list"
    assert listed["1.1.1.1:443"] == "1.1.1.1:443 is not on the allow-list"
    assert f"127.0.0.1:{port}" in listed and f"{ALLOWED}:{port + 1}" in listed
    assert listed["127.0.0.1:3128"] == "127.0.0.1:3128 is not on the allow-list"  # the proxy has no admin


@pytest.mark.root
async def test_a_local_run_reaches_its_allowed_host_and_nothing_else(work_root, allowed_server, probe_skill):
    runtime = LocalWorkspaceRuntime(work_root)
    try:
        result = await runtime.run(_request(probe_skill, allowed_server, workspace_id="egress-local"))
        _check_contained(result, allowed_server)
        again = await runtime.run(_request(probe_skill, allowed_server, workspace_id="egress-local"))
        _check_contained(again, allowed_server)  # a warm workspace: still a sandbox of its own, still served
        offline = await runtime.run(RunRequest(skill=probe_skill, command=f"python3 probe.py {allowed_server}",
                                               workspace_id="egress-local", timeout=120))
        found = json.loads(offline.stdout)
        assert found["get"].startswith("error") and found["connect"].startswith("error")  # no allow-list: no way out
        assert offline.egress_refused == 0
    finally:
        await runtime.close()


async def test_a_local_run_without_a_sandbox_refuses_an_allow_list(work_root, allowed_server, probe_skill):
    runtime = LocalWorkspaceRuntime(work_root, sandbox=False)
    try:
        with pytest.raises(InvalidRunRequestError, match="egress: an egress allow-list needs the local runtime's "
                                                         "sandbox"):
            await runtime.run(_request(probe_skill, allowed_server))
    finally:
        await runtime.close()


@pytest.mark.docker
async def test_a_docker_run_reaches_its_allowed_host_and_nothing_else(docker_runtime_factory, allowed_server,
                                                                      probe_skill, work_root):
    runtime = docker_runtime_factory()
    for _ in range(2):  # the second in the same container, its loopback port reused after the first's connections
        result = await runtime.run(_request(probe_skill, allowed_server, runtime=RuntimeName.DOCKER,
                                            workspace_id="egress-docker"))
        _check_contained(result, allowed_server)
    assert not list(work_root.rglob(".skillrun-egress-*"))  # the proxy's socket went with the run



@pytest.mark.docker
async def test_a_docker_run_under_gvisor_refuses_an_allow_list(docker_runtime_factory, allowed_server, probe_skill):
    runtime = docker_runtime_factory(oci_runtime="runsc")
    with pytest.raises(InvalidRunRequestError, match="egress: .* cannot reach the worker's proxy under gVisor"):
        await runtime.run(_request(probe_skill, allowed_server, runtime=RuntimeName.DOCKER))


async def test_a_cube_run_with_an_allow_list_is_refused_before_anything_runs(cube_runtime_factory, probe_skill):
    runtime = cube_runtime_factory()
    with pytest.raises(InvalidRunRequestError, match="egress: the cube runtime cannot hold a run to an egress "
                                                     "allow-list"):
        await runtime.run(_request(probe_skill, 443, runtime=RuntimeName.CUBE))


@pytest.mark.root
async def test_a_queued_run_carries_its_allow_list_to_a_worker_and_its_refusals_back(redis_url, workers,
                                                                                    allowed_server, probe_skill):
    workers.env["SKILLRUN_EGRESS_PINNED_HOSTS"] = f"{ALLOWED}=127.0.0.1"  # the worker process's own setting
    workers.start()
    dispatcher = QueueDispatcher(redis_url)
    try:
        record = await dispatcher.submit(_request(probe_skill, allowed_server), owner="team-a")
        record = await dispatcher.wait(record.id, 120)
    finally:
        await dispatcher.close()
    assert record.status == RunStatus.FINISHED, record.error
    assert record.request.egress == [f"{ALLOWED}:{allowed_server}"]
    _check_contained(record.result, allowed_server)


@pytest.mark.root
def test_skillrun_run_with_egress_prints_the_refusals(allowed_server, probe_skill, work_root):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKILLRUN_", "SKILLS_"))}
    env["SKILLRUN_EGRESS_PINNED_HOSTS"] = f"{ALLOWED}=127.0.0.1"
    argv = [sys.executable, "-m", "orchestrator.cli", "run", "probe", f"python3 probe.py {allowed_server}",
            "--skills-root", probe_skill.root, "--work-root", str(work_root), "--egress",
            f"{ALLOWED}:{allowed_server}"]
    shown = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["get"] == "reached /plain"
    assert "egress refused 5 connection(s):" in shown.stderr
    assert "  refused.example.org:443: refused.example.org:443 is not on the allow-list" in shown.stderr
    as_json = json.loads(subprocess.run([*argv, "--json"], capture_output=True, text=True, env=env,
                                        timeout=120).stdout)
    assert as_json["egress_refused"] == 5 and len(as_json["egress_refusals"]) == 5
    refused = subprocess.run([*argv[:-1], "10.0.0.0/8"], capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and "egress entry '10.0.0.0/8' is an address range" in refused.stderr


@pytest.mark.root
async def test_an_mcp_skill_run_gets_its_teams_allow_list_through_the_queue(redis_url, workers, allowed_server,
                                                                            probe_skill, shared_dir):
    workers.env["SKILLRUN_EGRESS_PINNED_HOSTS"] = f"{ALLOWED}=127.0.0.1"
    workers.start()
    (Path(probe_skill.root) / "probe" / "SKILL.md").write_text(
        f"---\nname: probe\ndescription: Probes.\nmetadata:\n  egress: ['{ALLOWED}:{allowed_server}']\n---\nx\n")
    services = make_services(QueueDispatcher(redis_url), FileArtifactStore(shared_dir / "artifacts"),
                             shared_dir / "data")
    services.repository = create_default_skill_repository(probe_skill.root, use_cached_repository=True)
    key = new_team(services, "team-a")
    EgressStore(services.teams.docs).set("team-a", [f"*.allowed-egress.net:{allowed_server}"])
    try:
        with api_in_a_thread(services) as url:
            async with mcp_session(url, key) as (session, _):
                result = await session.call_tool("skill_run", {"skill": "probe",
                                                               "command": f"python3 probe.py {allowed_server}"})
    finally:
        await services.close()
    assert not result.isError, result.content[0].text
    found = json.loads(result.structuredContent["stdout"])
    assert found["get"] == "reached /plain" and found["connect_refused_host"] == "403"
