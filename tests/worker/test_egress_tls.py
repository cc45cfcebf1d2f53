"""A tunnel's ClientHello as the egress proxy reads it (``worker.egress.tls``): real hellos from Python's ``ssl``
module and crafted ones are read exactly (never a byte past the record that ends the hello, never more than
``HELLO_BYTES``), their server name is checked against the tunnel's host, and any other bytes — generated, truncated,
mutated (hypothesis) — end in a refusal and nothing else. The start of the server's answer is read as exactly: a
HelloRetryRequest (from Python's ``ssl`` server, or crafted) is told from anything else, and a hello that answers one
may come after a ChangeCipherSpec record."""

from __future__ import annotations

import asyncio
import hashlib
import ssl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.egress_tls import ENCRYPTED_CLIENT_HELLO, certificate, crafted_hello, python_hello, server_name_extension
from worker.egress.policy import Target, TunnelRefusedError
from worker.egress.tls import (
    HELLO_BYTES,
    HELLO_RETRY_RANDOM,
    MAX_HELLO_RECORDS,
    ClientHello,
    client_hello,
    hello_retry,
    read_client_hello,
    read_server_answer,
)

HOST = "api.example.org"
TARGET = Target((HOST, 443), f"{HOST}:443")
REAL = python_hello(HOST)
SEEDS = [REAL, python_hello(None), crafted_hello([server_name_extension(HOST)], records=3),
         crafted_hello([server_name_extension(HOST), (ENCRYPTED_CLIENT_HELLO, bytes(40))])]
"""Well-formed hellos the generated ones are made from."""
CHANGE_CIPHER_SPEC = b"\x14\x03\x03\x00\x01\x01"
ANSWER_START = 5 + 4 + 2 + 32
"""What ``hello_retry`` reads of a ServerHello in one record: a record header, the message's header, version and
random."""


def crafted_server_hello(random: bytes, records: int = 1, then: bytes = b"") -> bytes:
    """A TLS 1.3 ServerHello with ``random``, split over ``records`` records, the last followed in its record by
    ``then`` (more handshake messages, as a TLS 1.2 server sends its certificate after its hello)."""
    body = b"\x03\x03" + random + b"\x20" + bytes(32) + b"\x13\x01\x00" + b"\x00\x06\x00\x2b\x00\x02\x03\x04"
    message = b"\x02" + len(body).to_bytes(3, "big") + body
    size = -(-len(message) // records)
    parts = [message[at:at + size] for at in range(0, len(message), size)]
    parts[-1] += then
    return b"".join(b"\x16\x03\x03" + len(part).to_bytes(2, "big") + part for part in parts)


RETRY = crafted_server_hello(HELLO_RETRY_RANDOM)
ANSWER_SEEDS = [RETRY, crafted_server_hello(bytes(32)), crafted_server_hello(HELLO_RETRY_RANDOM, records=3),
                crafted_server_hello(bytes(range(32)), then=b"\x0b\x00\x00\x03abc"), b"\x15\x03\x03\x00\x02\x02\x28"]
"""Well-formed server answers the generated ones are made from (the last an alert)."""


@pytest.fixture
def server_context(tmp_path) -> ssl.SSLContext:
    """A TLS server's context for ``HOST``, as Python's ``ssl`` makes it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate(tmp_path, HOST))
    return context


def real_answer(context: ssl.SSLContext, hello: bytes) -> bytes:
    """What Python's ``ssl`` server with ``context`` answers ``hello`` with."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_side=True)
    incoming.write(hello)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


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


def test_a_hello_that_answers_a_retry_may_come_after_one_change_cipher_spec_record():
    assert client_hello(CHANGE_CIPHER_SPEC[:5], retried=True) == 1  # then exactly the record's one byte
    assert client_hello(CHANGE_CIPHER_SPEC, retried=True) == 5  # then the hello's record header
    assert client_hello(CHANGE_CIPHER_SPEC + REAL, retried=True) == client_hello(REAL)
    assert client_hello(REAL, retried=True) == client_hello(REAL)  # it may come without one
    with pytest.raises(ValueError, match="not a TLS handshake record"):
        client_hello(CHANGE_CIPHER_SPEC + REAL)  # not before a first hello
    with pytest.raises(ValueError, match="not a TLS handshake record"):
        client_hello(CHANGE_CIPHER_SPEC * 2 + REAL, retried=True)  # one, no more
    for malformed in (b"\x14\x03\x03\x00\x02\x01\x01", b"\x14\x03\x03\x00\x01\x02", b"\x14\x02\x00\x00\x01\x01"):
        with pytest.raises(ValueError, match="malformed ChangeCipherSpec"):
            client_hello(malformed + REAL, retried=True)


def test_the_hello_retry_random_is_the_one_rfc_8446_names():
    assert HELLO_RETRY_RANDOM == hashlib.sha256(b"HelloRetryRequest").digest()
    assert HELLO_RETRY_RANDOM.hex().startswith("cf21ad74e59a6111be1d8c021e65b891")


def test_a_real_servers_hello_retry_request_is_told_from_its_server_hello(server_context):
    assert hello_retry(real_answer(server_context, REAL)) is False  # it takes the client's key share
    server_context.set_ecdh_curve("secp384r1")  # and now it asks for another
    retry = real_answer(server_context, REAL)
    assert hello_retry(retry) is True
    assert hello_retry(retry[:ANSWER_START - 1]) == 1  # read no further than the random
    assert hello_retry(retry[:ANSWER_START] + b"more, not looked at") is True


def test_a_server_answer_is_read_exactly_up_to_its_random():
    asked, data = [], b""
    while not isinstance(found := hello_retry(data), bool):
        asked.append(found)
        data += RETRY[len(data):len(data) + found]
    assert found is True and data == RETRY[:ANSWER_START] and asked == [1, 4, ANSWER_START - 5]
    several = crafted_server_hello(HELLO_RETRY_RANDOM, records=4)
    asked, data = [], b""
    while not isinstance(found := hello_retry(data), bool):
        asked.append(found)
        data += several[len(data):len(data) + found]
    assert found is True and asked == [1, 4, 21, 5, 17]  # 21 of it in each record: the first, then 17 of the next


@pytest.mark.parametrize(("data", "retry"), [
    (crafted_server_hello(bytes(32)), False),
    (crafted_server_hello(HELLO_RETRY_RANDOM[:-1] + b"\x00"), False),
    (crafted_server_hello(HELLO_RETRY_RANDOM, then=b"\x0b\x00\x00\x00"), True),
    (b"\x15\x03\x03\x00\x02\x02\x28", False),  # an alert
    (b"\x17\x03\x03\x00\x10" + bytes(16), False),  # application data
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", False),  # not TLS at all
    (b"\x16\x03\x03\x00\x04\x0b\x00\x00\x00", False),  # a first message that is not a ServerHello
])
def test_only_a_server_hello_with_the_retry_random_is_a_hello_retry_request(data, retry):
    assert hello_retry(data) is retry


@pytest.mark.parametrize(("data", "why"), [
    (b"\x16\x03\x03\x00\x00", "bad length"),
    (b"\x16\x03\x03\x40\x01", "bad length"),
    (b"\x16\x02\x00\x00\x04", "not a TLS handshake record"),
    (b"\x16\x03\x03\x00\x02\x02\x00" + b"\x15\x03\x03\x00\x02\x02\x28", "not a TLS handshake record"),
    (b"".join(b"\x16\x03\x03\x00\x01" + bytes([byte]) for byte in RETRY[5:5 + MAX_HELLO_RECORDS + 1]), "more than"),
    (b"\x16\x03\x03\x00\x26\x02\x00\x00\x10" + bytes(34), "shorter than its version and random"),
])
def test_handshake_records_that_hold_no_server_hello_start_are_malformed(data, why):
    with pytest.raises(ValueError, match=why):
        hello_retry(data)


async def _answer(data: bytes, limit: int = HELLO_BYTES) -> tuple[tuple[bytes, bool] | TunnelRefusedError, int]:
    """What ``read_server_answer`` makes of a server that answers ``data`` then ends: its result or refusal, and how
    many bytes it took."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    try:
        outcome: tuple[bytes, bool] | TunnelRefusedError = await read_server_answer(reader, TARGET, 5.0, limit)
    except TunnelRefusedError as refused:
        outcome = refused
    return outcome, len(data) - len(await reader.read())


async def test_the_answer_reader_takes_the_start_of_the_answer_and_leaves_the_rest():
    outcome, taken = await _answer(RETRY + CHANGE_CIPHER_SPEC)
    assert outcome == (RETRY[:ANSWER_START], True) and taken == ANSWER_START
    outcome, taken = await _answer(b"\x15\x03\x03\x00\x02\x02\x28")
    assert outcome == (b"\x15", False) and taken == 1


async def test_the_answer_reader_refuses_a_server_that_is_late_malformed_or_ends_inside_its_hello():
    reader = asyncio.StreamReader()
    reader.feed_data(RETRY[:20])
    with pytest.raises(TunnelRefusedError, match="did not answer its TLS ClientHello within 0.2 s"):
        await read_server_answer(reader, TARGET, 0.2)
    outcome, _ = await _answer(RETRY[:20])
    assert isinstance(outcome, TunnelRefusedError) and "ended the connection inside" in str(outcome)
    outcome, _ = await _answer(b"\x16\x03\x03\x00\x00")
    assert isinstance(outcome, TunnelRefusedError) and outcome.destination == TARGET.named and outcome.kind
    assert await _answer(b"") == ((b"", False), 0)  # a server that closed at once answered nothing: no refusal


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


async def _read(data: bytes, limit: int = HELLO_BYTES, retried: bool = False) -> tuple[bytes | TunnelRefusedError, int]:
    """What ``read_client_hello`` makes of a tunnel that sends ``data`` then ends: its result or refusal, and how many
    bytes it took."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    try:
        outcome: bytes | TunnelRefusedError = await read_client_hello(reader, TARGET, 5.0, limit, retried=retried)
    except TunnelRefusedError as refused:
        outcome = refused
    return outcome, len(data) - len(await reader.read())


async def test_the_reader_takes_the_hello_and_leaves_what_follows():
    outcome, taken = await _read(REAL + b"\x17\x03\x03 application data")
    assert outcome == REAL and taken == len(REAL)


async def test_the_reader_refuses_naming_the_tunnel_and_nothing_the_client_sent():
    outcome, _ = await _read(python_hello("secret-name.example.org"))
    assert isinstance(outcome, TunnelRefusedError) and outcome.destination == TARGET.named
    assert "secret-name" not in str(outcome) and outcome.response(None) == b""  # the 200 went: no HTTP answer
    outcome, _ = await _read(b"GET /?token=secret HTTP/1.1\r\n\r\n")
    assert isinstance(outcome, TunnelRefusedError) and "token" not in str(outcome)
    outcome, taken = await _read(b"\x16\x03\x03\x40\x00" + bytes(2**14))  # a full record, past the bound
    assert isinstance(outcome, TunnelRefusedError) and taken == 5


async def test_the_reader_waits_for_a_hello_no_longer_than_it_is_told():
    reader = asyncio.StreamReader()
    reader.feed_data(REAL[:100])
    with pytest.raises(TunnelRefusedError, match="sent no TLS ClientHello within 0.2 s"):
        await read_client_hello(reader, TARGET, 0.2)


async def test_a_tunnel_ended_before_its_first_byte_asked_nothing_and_one_ended_inside_its_hello_is_refused():
    reader = asyncio.StreamReader()
    reader.feed_eof()
    with pytest.raises(asyncio.IncompleteReadError):
        await read_client_hello(reader, TARGET, 1.0)
    outcome, _ = await _read(REAL[:-1])
    assert isinstance(outcome, TunnelRefusedError) and "ended inside its ClientHello" in str(outcome)


@st.composite
def hostile(draw, seeds: list[bytes] = SEEDS) -> bytes:
    """Bytes a tunnel's client might send first (or its server answer): random, or one of ``seeds`` cut, changed and
    added to."""
    if draw(st.booleans()):
        return draw(st.binary(min_size=1, max_size=HELLO_BYTES + 64))
    data = bytearray(draw(st.sampled_from(seeds)))
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
@given(hostile(), st.sampled_from([HELLO_BYTES, 600, 64]), st.booleans())
def test_hostile_first_bytes_end_in_a_hello_or_a_refusal_and_are_read_no_further_than_the_bound(data, limit,
                                                                                                retried):
    if retried and data[:1] == b"\x16":
        data = CHANGE_CIPHER_SPEC + data
    try:
        found = client_hello(data, limit, retried=retried)
    except ValueError:
        found = None
    if isinstance(found, int):
        assert 0 < found and len(data) + found <= limit  # never asks past the bound
    outcome, taken = asyncio.run(_read(data, limit, retried))
    assert taken <= limit
    assert isinstance(outcome, TunnelRefusedError) or (outcome == data[:taken] and isinstance(found, ClientHello))


@settings(max_examples=300, deadline=None)
@given(hostile(ANSWER_SEEDS), st.sampled_from([HELLO_BYTES, 48, 8]))
def test_hostile_server_answers_end_in_a_verdict_or_a_refusal_and_are_read_no_further_than_the_start(data, limit):
    try:
        found = hello_retry(data, limit)
    except ValueError:
        found = None
    if found is not None and not isinstance(found, bool):
        assert 0 < found and len(data) + found <= limit  # never asks past the bound
    outcome, taken = asyncio.run(_answer(data, limit))
    assert taken <= min(limit, 5 * MAX_HELLO_RECORDS + ANSWER_START)  # never past the first message's random
    if isinstance(found, bool):
        assert outcome == (data[:taken], found)
    else:
        assert isinstance(outcome, TunnelRefusedError)
