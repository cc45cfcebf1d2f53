"""A tunnel's ClientHello as the egress proxy reads it (``worker.egress.tls``): real hellos from Python's ``ssl``
module and crafted ones are read exactly (never a byte past the record that ends the hello, never more than
``HELLO_BYTES``), their server name is checked against the tunnel's host, and any other bytes — generated, truncated,
mutated (hypothesis) — end in a refusal and nothing else."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.egress_tls import ENCRYPTED_CLIENT_HELLO, crafted_hello, python_hello, server_name_extension
from worker.egress.policy import Target, TunnelRefused
from worker.egress.tls import HELLO_BYTES, MAX_HELLO_RECORDS, ClientHello, client_hello, read_client_hello

HOST = "api.example.org"
TARGET = Target((HOST, 443), f"{HOST}:443")
REAL = python_hello(HOST)
SEEDS = [REAL, python_hello(None), crafted_hello([server_name_extension(HOST)], records=3),
         crafted_hello([server_name_extension(HOST), (ENCRYPTED_CLIENT_HELLO, bytes(40))])]
"""Well-formed hellos the generated ones are made from."""


def test_a_real_client_hello_is_read_exactly_and_names_its_server():
    assert client_hello(b"") == 5  # a record header first
    assert client_hello(REAL[:3]) == 2
    assert client_hello(REAL[:5]) == len(REAL) - 5  # then exactly the record
    hello = client_hello(REAL)
    assert hello.server_name == HOST and 0 in hello.extensions
    assert client_hello(REAL + b"more, not looked at") == hello
    assert client_hello(python_hello(None)).server_name is None
    assert client_hello(python_hello("127.0.0.1")).server_name is None  # ssl sends none for an address


def test_a_client_hello_in_several_records_is_read_record_by_record():
    several = crafted_hello([server_name_extension(HOST)], records=4)
    asked, data = [], b""
    while isinstance(found := client_hello(data), int):
        asked.append(found)
        data += several[len(data):len(data) + found]
    assert data == several and found == ClientHello(HOST, frozenset({0}))
    assert len(asked) == 8  # a header, then its record, four times


@pytest.mark.parametrize(("data", "why"), [
    (b"GET / HTTP/1.1\r\n\r\n", "not a TLS handshake record"),
    (b"\x17\x03\x03\x00\x10" + bytes(16), "not a TLS handshake record"),  # application data
    (b"\x16\x03\x03\x00\x00", "bad length"),
    (b"\x16\x03\x03\x40\x01", "bad length"),  # more than a record may hold
    (b"\x16\x03\x03\x00\x04\x02\x00\x00\x00", "not a ClientHello"),  # a ServerHello
    (b"\x16\x03\x03\x00\x04\x01\x00\x40\x00", f"longer than {HELLO_BYTES} bytes"),  # said before it is read
    (crafted_hello([server_name_extension(HOST, "other.example.org")]), "one server, once"),
    (crafted_hello([server_name_extension(HOST), server_name_extension(HOST)]), "an extension twice"),
    (crafted_hello([(0, b"\x00\x05\x01\x00\x02ab")]), "not a host name"),
    (crafted_hello([server_name_extension("bad name")]), "printable ASCII"),
    (crafted_hello([(0, b"\x00")]), "malformed"),
    (crafted_hello([server_name_extension(HOST)], records=MAX_HELLO_RECORDS + 1), "more than"),
    (b"\x16\x03\x01" + (len(REAL) - 4).to_bytes(2, "big") + REAL[5:] + b"\x00", "followed by more"),
])
def test_bytes_that_are_no_acceptable_client_hello_are_refused_with_a_reason(data, why):
    with pytest.raises(ValueError, match=why):
        client_hello(data)


@pytest.mark.parametrize(("hello", "host", "refused"), [
    (ClientHello("API.Example.ORG.", frozenset({0})), HOST, None),  # case and a final dot aside
    (ClientHello("paste.attacker.example", frozenset({0})), HOST, "another server"),
    (ClientHello(None, frozenset()), HOST, "names no server"),
    (ClientHello(None, frozenset()), "203.0.113.7", None),  # a tunnel to an address may come without one
    (ClientHello("203.0.113.7", frozenset({0})), "203.0.113.7", None),
    (ClientHello(HOST, frozenset({0})), "203.0.113.7", "another server"),
    (ClientHello(HOST, frozenset({0, 0xFE0D})), HOST, "encrypted_client_hello"),  # the outer name proves nothing
    (ClientHello(HOST, frozenset({0, 0xFFCE})), HOST, "encrypted_server_name"),
])
def test_a_client_hello_must_name_the_tunnels_host_and_hide_no_other(hello, host, refused):
    why = hello.refusal(host)
    assert why is None if refused is None else refused in why


async def _read(data: bytes, limit: int = HELLO_BYTES, seconds: float = 5.0) -> tuple[bytes | TunnelRefused, int]:
    """What ``read_client_hello`` makes of a tunnel that sends ``data`` then ends: its result or refusal, and how many
    bytes it took."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    try:
        outcome: bytes | TunnelRefused = await read_client_hello(reader, TARGET, seconds, limit)
    except TunnelRefused as refused:
        outcome = refused
    return outcome, len(data) - len(await reader.read())


async def test_the_reader_takes_the_hello_and_leaves_what_follows():
    outcome, taken = await _read(REAL + b"\x17\x03\x03 application data")
    assert outcome == REAL and taken == len(REAL)


async def test_the_reader_refuses_naming_the_tunnel_and_nothing_the_client_sent():
    outcome, _ = await _read(python_hello("secret-name.example.org"))
    assert isinstance(outcome, TunnelRefused) and outcome.destination == TARGET.named
    assert "secret-name" not in str(outcome) and outcome.response(None) == b""  # the 200 went: no HTTP answer
    outcome, _ = await _read(b"GET /?token=secret HTTP/1.1\r\n\r\n")
    assert isinstance(outcome, TunnelRefused) and "token" not in str(outcome)
    outcome, taken = await _read(b"\x16\x03\x03\x40\x00" + bytes(2**14))  # a full record, past the bound
    assert isinstance(outcome, TunnelRefused) and taken == 5


async def test_the_reader_waits_for_a_hello_no_longer_than_it_is_told():
    reader = asyncio.StreamReader()
    reader.feed_data(REAL[:100])
    with pytest.raises(TunnelRefused, match="sent no TLS ClientHello within 0.2 s"):
        await read_client_hello(reader, TARGET, 0.2)


async def test_a_tunnel_ended_before_its_first_byte_asked_nothing_and_one_ended_inside_its_hello_is_refused():
    reader = asyncio.StreamReader()
    reader.feed_eof()
    with pytest.raises(asyncio.IncompleteReadError):
        await read_client_hello(reader, TARGET, 1.0)
    outcome, _ = await _read(REAL[:-1])
    assert isinstance(outcome, TunnelRefused) and "ended inside its ClientHello" in str(outcome)


@st.composite
def hostile(draw) -> bytes:
    """Bytes a tunnel's client might send first: random, or a well-formed hello cut, changed and added to."""
    if draw(st.booleans()):
        return draw(st.binary(min_size=1, max_size=HELLO_BYTES + 64))
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        choice = draw(st.sampled_from(["set", "insert", "cut"]))
        if choice == "set":
            data[at] = draw(st.integers(0, 255))
        elif choice == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[at:at + draw(st.integers(1, 64))]
    return bytes(data) or b"\x16"


@settings(max_examples=300, deadline=None)
@given(hostile(), st.sampled_from([HELLO_BYTES, 600, 64]))
def test_hostile_first_bytes_end_in_a_hello_or_a_refusal_and_are_read_no_further_than_the_bound(data, limit):
    try:
        found = client_hello(data, limit)
    except ValueError:
        found = None
    if isinstance(found, int):
        assert 0 < found and len(data) + found <= limit  # never asks past the bound
    outcome, taken = asyncio.run(_read(data, limit))
    assert taken <= limit
    assert isinstance(outcome, TunnelRefused) or (outcome == data[:taken] and isinstance(found, ClientHello))
