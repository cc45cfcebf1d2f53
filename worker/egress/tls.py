"""What a ``CONNECT`` tunnel must carry first: a TLS ClientHello that names the host the tunnel was opened to.

Without this check a tunnel to an allowed host could carry a TLS connection to another host that the same server
(a CDN, a shared front end) also serves: the server picks the site from the ClientHello's server name (SNI), not from
the address it was reached at (domain fronting). So before the egress proxy relays a tunnel it reads its first bytes
(``read_client_hello``): the TLS records that hold the ClientHello, no more than ``HELLO_BYTES`` of them and within the
time it is given, and refuses the tunnel (``TunnelRefusedError``) when they are not a well-formed ClientHello, when its
server name is not the ``CONNECT`` host (case and a final dot aside), when it names none and the host is a name
(a tunnel to an address may come without one, as TLS leaves it), or when it carries an extension that hides the name
it is really for (``HIDING_EXTENSIONS``: Encrypted Client Hello, and the ESNI draft before it). What it read goes on
to the host when it passes.

A TLS 1.3 server may answer a ClientHello with a HelloRetryRequest (a ServerHello whose random is
``HELLO_RETRY_RANDOM``: it asks for another key share, or a cookie), and the client then sends a second ClientHello,
which could name another host. So the proxy reads the start of the server's answer too (``read_server_answer``: no
more than its first message's type, length, version and random, within the time it is given), and after a
HelloRetryRequest it reads the client's next ClientHello (after the ChangeCipherSpec record a client may send first)
and checks it as the first. A server sends at most one HelloRetryRequest, as a client that gets a second must end the
handshake (RFC 8446, 4.1.4), so nothing later is read; a server that sent another (only one of the attacker's own
could) would be an allowed host carrying what it is sent, fronting or not.

The parsers (``client_hello``, ``hello_retry``) read bytes a sandbox wrote, or a server answered it: every length is
checked against what is there before it is used, they look at nothing past what they need (the record that ends the
ClientHello; the start of the server's first message), they never ask for more than ``HELLO_BYTES`` in all, and the
only error they raise is ``ValueError`` with a reason of their own (never the bytes they read).

What this does not see: a server that serves several names under one certificate, an HTTP/2 ``:authority`` or
HTTP/1 ``Host`` inside the TLS connection, or the ClientHello of a TLS 1.2 renegotiation (all encrypted: the names in
the ClientHellos before the server's keys are all the proxy can read).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
from dataclasses import dataclass

from worker.names import is_address
from worker.egress.policy import Target, TunnelRefusedError

HELLO_BYTES = 8 * 1024
"""The most of a tunnel's first bytes read for its ClientHello, record headers included (one is 0.5-2 KiB)."""
RECORD_HEADER_BYTES = 5
"""A TLS record's header: its content type, version (2 bytes) and length (2 bytes)."""
MAX_RECORD_BYTES = 2**14
"""The most a TLS record may carry (RFC 8446, 5.1)."""
MAX_HELLO_RECORDS = 8
"""The most records a ClientHello may come in (clients send it in one; each is walked again as the next comes)."""
HANDSHAKE_HEADER_BYTES = 4
"""A handshake message's header: its type and length (3 bytes)."""
HANDSHAKE_RECORD = 22
CHANGE_CIPHER_SPEC_RECORD = 20
CHANGE_CIPHER_SPEC_BYTES = RECORD_HEADER_BYTES + 1
"""A ChangeCipherSpec record: its header, then its one byte (1)."""
CLIENT_HELLO = 1
SERVER_HELLO = 2
SERVER_HELLO_START_BYTES = HANDSHAKE_HEADER_BYTES + 2 + 32
"""The start of a ServerHello that tells a HelloRetryRequest: its header, its version (2 bytes) and its random."""
HELLO_RETRY_RANDOM = hashlib.sha256(b"HelloRetryRequest").digest()
"""The random of a ServerHello that is a HelloRetryRequest (RFC 8446, 4.1.3)."""
SERVER_NAME_EXTENSION = 0
HOST_NAME = 0
HIDING_EXTENSIONS = {0xFE0D: "encrypted_client_hello", 0xFFCE: "encrypted_server_name"}
"""Extensions that carry the server name a ClientHello is really for encrypted, under an outer name: refused."""
_MALFORMED = "a malformed TLS ClientHello"
_HELLO = "a ClientHello"
_ANSWER = "a server's first TLS message"


@dataclass(frozen=True)
class ClientHello:
    """What the proxy reads of a ClientHello: its server name (SNI, as sent; ``None`` without one) and the types
    of its extensions."""

    server_name: str | None
    extensions: frozenset[int]

    def refusal(self, host: str) -> str | None:
        """Why a tunnel to ``host`` (normalised, as ``Target.address`` holds it) may not carry this ClientHello,
        or ``None`` when it may."""
        hidden = sorted(HIDING_EXTENSIONS.keys() & self.extensions)
        if hidden:
            return f"the TLS ClientHello carries {HIDING_EXTENSIONS[hidden[0]]}, which hides the server it is for"
        if self.server_name is None and not is_address(host):
            return "the TLS ClientHello names no server (SNI), which a tunnel to a host name must"
        if self.server_name is not None and _normalised(self.server_name) != host:
            return "the TLS ClientHello names another server (SNI) than the CONNECT target (domain fronting)"
        return None


async def read_client_hello(reader: asyncio.StreamReader, target: Target, seconds: float,
                            limit: int = HELLO_BYTES, *, retried: bool = False) -> bytes:
    """The first bytes of a tunnel to ``target`` (with ``retried``: the next ones, after the server's
    HelloRetryRequest), read from ``reader`` within ``seconds``: the TLS records that hold its ClientHello, when that
    hello may go to ``target``; ``TunnelRefusedError`` (naming ``target``) otherwise. ``asyncio.IncompleteReadError`` when
    the client ends the tunnel before sending anything (it asked nothing)."""
    try:
        data, hello = await asyncio.wait_for(_read(reader, limit, retried), seconds)
    except TimeoutError:
        raise TunnelRefusedError(f"the tunnel to {target.named} sent no TLS ClientHello within {seconds:g} s",
                            target.named, kind="no TLS ClientHello in time") from None
    except ValueError as exc:
        sent = "did not answer its server's HelloRetryRequest with" if retried else "did not begin with"
        raise TunnelRefusedError(f"the tunnel to {target.named} {sent} a TLS ClientHello it may carry: {exc}",
                            target.named, kind="malformed TLS ClientHello") from None
    why = hello.refusal(target.address[0])
    if why is not None:
        raise TunnelRefusedError(f"the tunnel to {target.named} was closed: {why}", target.named,
                            kind="TLS server name")
    return data


async def read_server_answer(reader: asyncio.StreamReader, target: Target, seconds: float,
                             limit: int = HELLO_BYTES) -> tuple[bytes, bool]:
    """The first bytes the server of a tunnel to ``target`` answers its ClientHello with, read from ``reader``
    within ``seconds``, no more than ``hello_retry`` needs, and whether they open a HelloRetryRequest;
    ``TunnelRefusedError`` (naming ``target``) when they do not come in time, or open TLS handshake records that hold no
    server's first message. A server that ends the connection before sending anything answered ``b""`` (no retry)."""
    try:
        return await asyncio.wait_for(_read_answer(reader, limit), seconds)
    except TimeoutError:
        raise TunnelRefusedError(f"the server of the tunnel to {target.named} did not answer its TLS ClientHello within "
                            f"{seconds:g} s", target.named, kind="no TLS answer in time") from None
    except ValueError as exc:
        raise TunnelRefusedError(f"the server of the tunnel to {target.named} answered its TLS ClientHello with bytes "
                            f"the proxy cannot read: {exc}", target.named, kind="malformed TLS answer") from None


async def _read(reader: asyncio.StreamReader, limit: int, retried: bool) -> tuple[bytes, ClientHello]:
    """Read exactly what ``client_hello`` asks for until it has the hello; ``ValueError`` as it."""
    data = b""
    while isinstance(found := client_hello(data, limit, retried=retried), int):
        try:
            data += await reader.readexactly(found)
        except asyncio.IncompleteReadError as exc:
            if data or exc.partial:
                raise ValueError("the tunnel ended inside its ClientHello") from None
            raise
    return data, found


async def _read_answer(reader: asyncio.StreamReader, limit: int) -> tuple[bytes, bool]:
    """Read exactly what ``hello_retry`` asks for until it can tell; ``ValueError`` as it."""
    data = b""
    while not isinstance(found := hello_retry(data, limit), bool):
        try:
            data += await reader.readexactly(found)
        except asyncio.IncompleteReadError as exc:
            if data or exc.partial:
                raise ValueError("the server ended the connection inside its first TLS message") from None
            return b"", False
    return data, found


def client_hello(data: bytes, limit: int = HELLO_BYTES, *, retried: bool = False) -> ClientHello | int:
    """The ClientHello the TLS records at the start of ``data`` hold, or how many more bytes are needed to read
    on (exactly: the rest of a record header or record, never past the record that ends the hello); ``ValueError``
    when they cannot hold one, or would take more than ``limit`` bytes. With ``retried`` (a hello that answers a
    HelloRetryRequest) one ChangeCipherSpec record may come first (RFC 8446, D.4)."""
    message = b""
    offset = records = 0
    if retried and data[:1] == bytes([CHANGE_CIPHER_SPEC_RECORD]):
        if len(data) < CHANGE_CIPHER_SPEC_BYTES:
            return _more(data, CHANGE_CIPHER_SPEC_BYTES, limit, _HELLO)
        if data[1] != 3 or data[3:CHANGE_CIPHER_SPEC_BYTES] != b"\x00\x01\x01":
            raise ValueError("a malformed ChangeCipherSpec record")
        offset = CHANGE_CIPHER_SPEC_BYTES
    while True:
        if records == MAX_HELLO_RECORDS:
            raise ValueError(f"a ClientHello in more than {MAX_HELLO_RECORDS} records")
        if len(data) - offset < RECORD_HEADER_BYTES:
            return _more(data, offset + RECORD_HEADER_BYTES, limit, _HELLO)
        length = _record_length(data, offset)
        end = offset + RECORD_HEADER_BYTES + length
        if len(data) < end:
            return _more(data, end, limit, _HELLO)
        message += data[offset + RECORD_HEADER_BYTES:end]
        offset, records = end, records + 1
        if message[0] != CLIENT_HELLO:
            raise ValueError("the first handshake message is not a ClientHello")
        if len(message) < HANDSHAKE_HEADER_BYTES:
            continue
        size = HANDSHAKE_HEADER_BYTES + int.from_bytes(message[1:4], "big")
        if size + RECORD_HEADER_BYTES > limit:
            raise ValueError(f"a ClientHello longer than {limit} bytes")
        if len(message) > size:
            raise ValueError("a ClientHello followed by more in its record")
        if len(message) == size:
            return _parse(message[HANDSHAKE_HEADER_BYTES:])


def hello_retry(data: bytes, limit: int = HELLO_BYTES) -> bool | int:
    """Whether the bytes at the start of ``data``, a server's answer to a ClientHello, open with a HelloRetryRequest
    (a bool), or how many more bytes are needed to tell (an int; exactly: the rest of a record header, or of a
    record up to the first message's random, never more). ``False`` for anything a client cannot answer with another
    ClientHello: an alert or other bytes than a handshake record, a first message that is not a ServerHello, a
    ServerHello with another random. ``ValueError`` when handshake records open ``data`` but cannot hold the start of
    a ServerHello, or would take more than ``limit`` bytes to tell."""
    if not data:
        return 1  # the first byte tells whether a handshake record comes
    if data[0] != HANDSHAKE_RECORD:
        return False
    message = b""
    offset = records = 0
    while True:
        if records == MAX_HELLO_RECORDS:
            raise ValueError(f"a server's first TLS message in more than {MAX_HELLO_RECORDS} records")
        if (more := _more(data, offset + RECORD_HEADER_BYTES, limit, _ANSWER)) > 0:
            return more
        length = _record_length(data, offset)
        start = offset + RECORD_HEADER_BYTES
        end = start + min(length, SERVER_HELLO_START_BYTES - len(message))
        if (more := _more(data, end, limit, _ANSWER)) > 0:
            return more
        message += data[start:end]
        if message[0] != SERVER_HELLO:
            return False
        if len(message) == SERVER_HELLO_START_BYTES:
            if int.from_bytes(message[1:HANDSHAKE_HEADER_BYTES], "big") < len(message) - HANDSHAKE_HEADER_BYTES:
                raise ValueError("a ServerHello shorter than its version and random")
            return message[HANDSHAKE_HEADER_BYTES + 2:] == HELLO_RETRY_RANDOM
        offset, records = start + length, records + 1


def _record_length(data: bytes, offset: int) -> int:
    """The length of the TLS handshake record whose header is at ``offset`` (all there); ``ValueError`` when it is no
    handshake record or its length is not one a record may have."""
    kind, major, length = data[offset], data[offset + 1], int.from_bytes(data[offset + 3:offset + 5], "big")
    if kind != HANDSHAKE_RECORD or major != 3:
        raise ValueError("the bytes are not a TLS handshake record")
    if not 0 < length <= MAX_RECORD_BYTES:
        raise ValueError("a TLS record with a bad length")
    return length


def _more(data: bytes, needed: int, limit: int, what: str) -> int:
    """How many bytes past ``data`` make ``needed`` in all (none or fewer when they are there); ``ValueError``
    (naming ``what`` was read) past ``limit``."""
    if needed > limit:
        raise ValueError(f"{what} longer than {limit} bytes")
    return needed - len(data)


class _Cursor:
    """Bytes read in order, each length checked against what is left (``ValueError`` when it is not there)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def take(self, count: int) -> bytes:
        if count > len(self._data) - self._at:
            raise ValueError(_MALFORMED)
        self._at += count
        return self._data[self._at - count:self._at]

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, length_size: int) -> bytes:
        """A TLS vector: its length in ``length_size`` bytes, then that many bytes."""
        return self.take(self.number(length_size))

    def done(self) -> bool:
        return self._at == len(self._data)


def _parse(body: bytes) -> ClientHello:
    """A ClientHello's body (RFC 8446, 4.1.2; the same fields in TLS 1.0-1.2)."""
    hello = _Cursor(body)
    if hello.number(1) != 3:
        raise ValueError(_MALFORMED)
    hello.take(1 + 32)  # the version's minor number, the random
    session, suites, compressions = hello.vector(1), hello.vector(2), hello.vector(1)
    if len(session) > 32 or not suites or len(suites) % 2 or not compressions:
        raise ValueError(_MALFORMED)
    extensions: dict[int, bytes] = {}
    if not hello.done():  # TLS 1.2 and before allow a hello without extensions
        block = _Cursor(hello.vector(2))
        if not hello.done():
            raise ValueError(_MALFORMED)
        while not block.done():
            kind = block.number(2)
            if kind in extensions:
                raise ValueError("a ClientHello with an extension twice")
            extensions[kind] = block.vector(2)
    name = _server_name(extensions[SERVER_NAME_EXTENSION]) if SERVER_NAME_EXTENSION in extensions else None
    return ClientHello(name, frozenset(extensions))


def _server_name(extension: bytes) -> str:
    """The one host name a ``server_name`` extension holds (RFC 6066, 3)."""
    outer = _Cursor(extension)
    names = _Cursor(outer.vector(2))
    if not outer.done():
        raise ValueError(_MALFORMED)
    found = []
    while not names.done():
        if names.number(1) != HOST_NAME:
            raise ValueError("a server name that is not a host name")
        found.append(names.vector(2))
    if len(found) != 1:
        raise ValueError("a ClientHello must name one server, once")
    name = found[0]
    if not name or not all(0x21 <= byte < 0x7F for byte in name):
        raise ValueError("a server name that is not a printable ASCII host name")
    return name.decode("ascii")


def _normalised(name: str) -> str:
    """A server name as ``Target.address`` holds a host: lower case, no final dot, an address in its usual form."""
    name = name.lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


__all__ = ["HELLO_BYTES", "HELLO_RETRY_RANDOM", "HIDING_EXTENSIONS", "ClientHello", "client_hello", "hello_retry",
           "read_client_hello", "read_server_answer"]
