"""A build's way out (``worker.egress.proxy``): the allow-list proxy on its own, then real builds behind it.

The proxy is driven first over a listener on this host's loopback (no root needed): what it tunnels and forwards,
what it refuses and that the refusal is its own, how many connections it serves at once, when it ends them. Then
real builds (root: bubblewrap, sandbox users, the proxy placed in the build's loopback-only network namespace; and the
Docker runtime's build containers, relayed to the proxy's socket) probe their network from a build backend.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT, write_skill
from tests.egress_tls import python_hello
from tests.integration.conftest import docker_engine  # noqa: F401 - the Docker tests' engine fixture
from tests.package_index import PackageIndex, host_address, sdist
from worker.egress.policy import PYPI_HOSTS, AllowList
from worker.egress.proxy import MAX_CONNECTIONS, EgressProxy
from worker.environments import BuildSettings, EnvironmentBuilder, EnvironmentStore, SkillEnvironments, local_target
from worker.environments.steps import SandboxSteps
from worker.errors import DependencyError

# --- the proxy on its own -----------------------------------------------------------------------------------------


class Upstream:
    """A server standing for a host beyond the proxy (on this host's loopback unless told): it echoes what it gets
    (or, with ``reply``, answers each request head with it) and counts its connections, now and at most."""

    def __init__(self, reply: bytes | None = None) -> None:
        self.reply = reply
        self.heads: list[bytes] = []
        self.accepted = self.open = self.most = 0

    async def start(self, host: str) -> Upstream:
        self._server = await asyncio.start_server(self._serve, host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        self.most = max(self.most, self.open)
        try:
            if self.reply is None:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            else:
                while head := await reader.readuntil(b"\r\n\r\n"):
                    self.heads.append(head)
                    writer.write(self.reply)
                    await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open -= 1
            writer.close()

    async def close(self) -> None:
        self._server.close()
        await self._server.wait_closed()


@pytest.fixture
async def upstreams():
    made: list[Upstream] = []

    async def make(reply: bytes | None = None, host: str = "127.0.0.1") -> Upstream:
        made.append(await Upstream(reply).start(host))
        return made[-1]

    yield make
    for upstream in made:
        await upstream.close()


@pytest.fixture
async def proxies():
    """Proxies serving a listener on this host's loopback; each is closed after the test."""
    made: list[EgressProxy] = []

    def make(allowed: AllowList, **options) -> tuple[EgressProxy, int]:
        proxy = EgressProxy(allowed, **options)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        proxy.serve(listener)
        made.append(proxy)
        return proxy, listener.getsockname()[1]

    yield make
    for proxy in made:
        await proxy.close()


async def _ask(port: int, head: str) -> tuple[str, bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    """Send ``head`` to the proxy at ``port``: its status line, what follows its head (a refusal's reason, read to
    the end; nothing for a tunnel, which stays open) and the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode())
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status = answer.split(b"\r\n")[0].decode()
    rest = b"" if " 200 " in status else await asyncio.wait_for(reader.read(), 10)
    return status, rest, reader, writer


def _index(upstream: Upstream) -> AllowList:
    """An allow-list whose index is ``upstream`` (on loopback: allowed, as the operator's own index)."""
    return AllowList.for_index(f"http://127.0.0.1:{upstream.port}/simple")


async def test_a_connect_to_the_index_is_tunnelled_both_ways(proxies, upstreams):
    echo = await upstreams()
    _, port = proxies(_index(echo))
    status, _, reader, writer = await _ask(port, f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\n\r\n")
    assert status == "HTTP/1.1 200 Connection established"
    hello = python_hello(None)  # a tunnel begins with a ClientHello (to an address, without a server name)
    writer.write(hello + b"then anything")
    assert await asyncio.wait_for(reader.readexactly(len(hello) + 13), 10) == hello + b"then anything"
    writer.close()


async def test_another_port_of_the_index_host_and_a_host_off_the_list_are_refused_by_the_proxy(proxies, upstreams):
    index, other = await upstreams(), await upstreams()
    _, port = proxies(_index(index))
    for target in (f"127.0.0.1:{other.port}", "example.com:443", "169.254.169.254:80", f"localhost:{index.port}"):
        status, reason, _, _ = await _ask(port, f"CONNECT {target} HTTP/1.1\r\n\r\n")
        assert status == "HTTP/1.1 403 Forbidden", target
        assert b"is not on the allow-list" in reason and b"SKILLRUN_ENV_ALLOWED_HOSTS" in reason, reason
    assert other.accepted == 0


async def test_an_allowed_host_that_resolves_to_a_private_address_is_refused(proxies, upstreams):
    private = await upstreams()
    _, port = proxies(AllowList.for_index(None, f"localhost:{private.port}"))
    status, reason, _, _ = await _ask(port, f"CONNECT localhost:{private.port} HTTP/1.1\r\n\r\n")
    assert status == "HTTP/1.1 403 Forbidden"
    assert b"private or local address" in reason, reason
    assert private.accepted == 0


async def test_plain_http_reads_are_forwarded_in_origin_form_and_nothing_else_is(proxies, upstreams):
    index = await upstreams(reply=b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    _, port = proxies(_index(index))
    where = f"http://127.0.0.1:{index.port}"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    host = f"127.0.0.1:{index.port}"
    for path, given in (("/simple/alpha/", f"Host: {host}\r\n"), ("/files/alpha/alpha-1.0.whl?x=1", "")):
        # two requests on one kept-alive connection, the second without a Host header (the proxy sets it)
        writer.write(f"GET {where}{path} HTTP/1.1\r\n{given}Proxy-Authorization: secret\r\n\r\n".encode())
        assert await asyncio.wait_for(reader.readexactly(40), 10) == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    writer.close()
    assert index.heads == [f"GET /simple/alpha/ HTTP/1.1\r\nHost: {host}\r\n\r\n".encode(),
                           f"GET /files/alpha/alpha-1.0.whl?x=1 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()]
    status, _, _, _ = await _ask(port, f"POST {where}/upload HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
    assert status == "HTTP/1.1 405 Method Not Allowed"
    status, _, _, _ = await _ask(port, f"GET http://127.0.0.1:{index.port + 1}/ HTTP/1.1\r\n\r\n")
    assert status == "HTTP/1.1 403 Forbidden"
    assert len(index.heads) == 2


async def test_a_connect_flood_is_served_a_bounded_number_at_a_time(proxies, upstreams):
    held = await upstreams()
    _, port = proxies(_index(held), max_connections=4)
    clients = []
    for _ in range(40):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"CONNECT 127.0.0.1:{held.port} HTTP/1.1\r\n\r\n".encode())
        clients.append((reader, writer))
    await asyncio.sleep(0.5)
    assert held.most == 4 and held.accepted == 4
    for _, writer in clients[:4]:
        writer.close()
    await asyncio.sleep(0.5)
    assert held.accepted == 8 and held.most == 4, "the waiting connections were not served as slots freed"
    for _, writer in clients[4:]:
        writer.close()


async def test_an_idle_tunnel_is_ended(proxies, upstreams):
    echo = await upstreams()
    _, port = proxies(_index(echo), idle_seconds=0.3)
    _, _, reader, writer = await _ask(port, f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\n\r\n")
    hello = python_hello(None)
    writer.write(hello)
    assert await asyncio.wait_for(reader.read(), 5) == hello  # echoed, then nothing moved both ways: ended


async def test_closing_the_proxy_ends_its_connections_and_leaves_no_task_or_socket(upstreams):
    echo = await upstreams()
    tasks, sockets = len(asyncio.all_tasks()), _sockets()
    proxy = EgressProxy(_index(echo))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    proxy.serve(listener)
    tunnels = [await _ask(listener.getsockname()[1], f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\n\r\n")
               for _ in range(3)]
    await proxy.close()
    for _, _, reader, writer in tunnels:
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        await writer.wait_closed()
    await _settled(lambda: (len(asyncio.all_tasks()), _sockets()), (tasks, sockets))


def test_the_allow_list_is_the_index_and_the_operators_hosts():
    assert AllowList.for_index(None).hosts == frozenset(PYPI_HOSTS)
    mirror = AllowList.for_index("https://Mirror.Example.org./simple", "files.example.org, [2001:db8::1]:8443")
    assert mirror.hosts == {("mirror.example.org", 443), ("files.example.org", 443), ("2001:db8::1", 8443)}
    assert mirror.index == {("mirror.example.org", 443)}
    assert AllowList.for_index("http://user:pw@10.0.0.5:8080/simple").index == {("10.0.0.5", 8080)}
    with pytest.raises(DependencyError, match="SKILLRUN_ENV_ALLOWED_HOSTS has a bad entry"):
        AllowList.for_index(None, "files.example.org:http")
    with pytest.raises(DependencyError, match="SKILLRUN_ENV_INDEX_URL"):
        AllowList.for_index("file:///srv/index")


def _sockets() -> int:
    """Sockets this process holds open."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


async def _settled(measure, expected, seconds: float = 5.0) -> None:
    """Wait until ``measure()`` is ``expected`` (connections end a moment after their peers)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while (found := measure()) != expected and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert found == expected, "the proxy left tasks or sockets behind (tasks, sockets)"


# --- real builds behind it ----------------------------------------------------------------------------------------

PROBE = r'''
import asyncio, json, os, socket
found = {"direct": {}, "proxied": {}}
for name, address in DIRECT.items():
    try:
        socket.create_connection(tuple(address), timeout=3).close()
        found["direct"][name] = "connected"
    except OSError as exc:
        found["direct"][name] = f"refused: {exc}"
try:
    socket.getaddrinfo("pypi.org", 443)
    found["dns"] = "resolved"
except OSError as exc:
    found["dns"] = f"failed: {exc}"
proxy = os.environ["HTTPS_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
for name, target in PROXIED.items():
    with socket.create_connection((proxy[0], int(proxy[1])), timeout=10) as connection:
        connection.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := connection.recv(4096)):
            answer += chunk
        found["proxied"][name] = answer.split(b"\r\n")[0].decode()

async def flood():
    async def one():
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(proxy[0], int(proxy[1])), 3)
        except (OSError, asyncio.TimeoutError):
            return "waiting", None
        writer.write(f"CONNECT {PROXIED['index']} HTTP/1.1\r\n\r\n".encode())
        try:
            line = await asyncio.wait_for(reader.readline(), 3)
        except (OSError, asyncio.TimeoutError):
            return "waiting", writer
        return ("served" if b" 200 " in line else line.decode()), writer
    results = await asyncio.gather(*(one() for _ in range(FLOOD)))
    return [outcome for outcome, _ in results]
outcomes = asyncio.run(flood()) if FLOOD else []
found["flood"] = {outcome: outcomes.count(outcome) for outcome in set(outcomes)}
raise RuntimeError("PROBE:" + json.dumps(found))
'''


def _probe(dists: Path, name: str, index: PackageIndex, private: int, other: int, flood: int = 0) -> None:
    """A source distribution whose build probes the network: directly (another port of the index's host, cloud
    metadata), by name (DNS), and through its proxy (that port, a name the operator allowed that resolves to a
    private address, a public host nobody allowed, the index), then floods the proxy with ``flood`` tunnels."""
    host, port = index.url.split("/")[2].rsplit(":", 1)
    direct = {"other_port": [host, other], "metadata": ["169.254.169.254", 80]}
    proxied = {"other_port": f"{host}:{other}", "private_name": f"localhost:{private}",
               "public_host": "example.com:443", "index": f"{host}:{port}"}
    sdist(dists, name, "1.0", f"DIRECT = {direct!r}\nPROXIED = {proxied!r}\nFLOOD = {flood}\n{PROBE}")


def _found(message: str) -> dict:
    assert "PROBE:" in message, message
    return json.loads(message.rsplit("PROBE:", 1)[1].splitlines()[0])


def _assert_only_the_index(found: dict, *servers: Upstream) -> None:
    assert all(outcome.startswith("refused") for outcome in found["direct"].values()), found["direct"]
    assert found["dns"].startswith("failed"), "a build resolved a name itself"
    assert found["proxied"] == {"other_port": "HTTP/1.1 403 Forbidden", "private_name": "HTTP/1.1 403 Forbidden",
                                "public_host": "HTTP/1.1 403 Forbidden",
                                "index": "HTTP/1.1 200 Connection established"}, found["proxied"]
    assert [server.accepted for server in servers] == [0] * len(servers)


async def _servers(upstreams) -> tuple[Upstream, Upstream]:
    """A server on the host's loopback (reached only through a name that resolves to it) and one on the address
    the index is on, at another port."""
    return await upstreams(), await upstreams(host=host_address())


@pytest.fixture
def local_envs(shared_dir: Path, index: PackageIndex):
    made: list[SkillEnvironments] = []

    def make(allowed_hosts: str = "") -> SkillEnvironments:
        store = EnvironmentStore(shared_dir / "envs")
        settings = BuildSettings(index_url=index.url, sandboxed=True, timeout=120.0)
        steps = SandboxSteps(store.root / "bin", ca_bundle=None, memory_bytes=settings.memory_bytes, sandboxed=True,
                             allowed_hosts=allowed_hosts)
        made.append(SkillEnvironments(EnvironmentBuilder(store, settings, steps=steps), local_target))
        return made[-1]

    yield make
    for envs in made:
        envs.close()


@pytest.mark.root
@pytest.mark.slow
async def test_a_build_reaches_the_index_through_its_proxy_and_nothing_else(
    shared_dir: Path, local_envs, dists: Path, index: PackageIndex, upstreams
):
    private, other = await _servers(upstreams)
    _probe(dists, "prober", index, private.port, other.port)
    skill = write_skill(shared_dir / "lib", "prober", files={"requirements.txt": "prober\n"})
    status = await local_envs(f"localhost:{private.port}").prepare(skill, skill.parent, "prober")
    _assert_only_the_index(_found(status.message), private, other)


@pytest.mark.root
@pytest.mark.slow
async def test_a_build_that_floods_its_proxy_is_served_a_bounded_number_of_tunnels(
    shared_dir: Path, local_envs, dists: Path, index: PackageIndex, upstreams
):
    private, other = await _servers(upstreams)
    _probe(dists, "flooder", index, private.port, other.port, flood=300)
    skill = write_skill(shared_dir / "lib", "flooder", files={"requirements.txt": "flooder\n"})
    status = await local_envs().prepare(skill, skill.parent, "flooder")
    flood = _found(status.message)["flood"]
    assert 0 < flood.get("served", 0) <= MAX_CONNECTIONS, flood
    assert flood.get("waiting", 0) >= 300 - MAX_CONNECTIONS, flood


@pytest.mark.root
@pytest.mark.slow
async def test_a_build_leaves_no_socket_or_task_of_its_proxy_behind(shared_dir: Path, local_envs):
    envs = local_envs()
    first = write_skill(shared_dir / "lib", "first", files={"requirements.txt": "beta\n"})
    assert (await envs.prepare(first, first.parent, "first")).state == "ready"
    before = (len(asyncio.all_tasks()), _sockets())
    second = write_skill(shared_dir / "lib", "second", files={"requirements.txt": "alpha==1.0\n"})
    status = await envs.prepare(second, second.parent, "second")
    assert status.state == "ready", status.message
    await _settled(lambda: (len(asyncio.all_tasks()), _sockets()), before)


@pytest.mark.docker
@pytest.mark.slow
async def test_a_container_build_reaches_the_index_through_its_proxy_and_nothing_else(
    shared_dir: Path, dists: Path, index: PackageIndex, upstreams, docker_engine  # noqa: F811 - the fixture
):
    from worker.runtimes.docker.builds import ContainerSteps, DockerTargets

    private, other = await _servers(upstreams)
    _probe(dists, "prober", index, private.port, other.port)
    skill = write_skill(shared_dir / "lib", "prober", files={"requirements.txt": "prober\n"})
    client = docker_engine.client
    settings = BuildSettings(index_url=index.url, sandboxed=IS_ROOT, timeout=120.0)
    steps = ContainerSteps(lambda: client, ca_bundle=None, memory_bytes=settings.memory_bytes,
                           allowed_hosts=f"localhost:{private.port}")
    envs = SkillEnvironments(EnvironmentBuilder(EnvironmentStore(shared_dir / "envs"), settings, steps=steps),
                             DockerTargets(lambda: client, "skillrun/sandbox:latest"))
    try:
        status = await envs.prepare(skill, skill.parent, "prober")
        _assert_only_the_index(_found(status.message), private, other)
    finally:
        envs.close()
