"""What a ``CONNECT`` tunnel must carry first: a TLS ClientHello that names the host the tunnel was opened to.

Without this check a tunnel to an allowed host could carry a TLS connection to another host that the same server
(a CDN, a shared front end) also serves: the server picks the site from the ClientHello's server name (SNI), not from
the address it was reached at (domain fronting). So before the egress proxy relays a tunnel it reads its first bytes
(``read_client_hello``): the TLS records that hold the ClientHello, no more than ``HELLO_BYTES`` of them and within the
time it is given, and refuses the tunnel (``TunnelRefused``) when they are not a well-formed ClientHello, when its
server name is not the ``CONNECT`` host (case and a final dot aside), when it names none and the host is a name
(a tunnel to an address may come without one, as TLS leaves it), or when it carries an extension that hides the name
it is really for (``HIDING_EXTENSIONS``: Encrypted Client Hello, and the ESNI draft before it). What it read goes on
to the host when it passes.

The parser (``client_hello``) reads bytes a sandbox wrote: every length is checked against what is there before it
is used, it looks at nothing past the record that ends the ClientHello, it never asks for more than ``HELLO_BYTES``
in all, and the only error it raises is ``ValueError`` with a reason of its own (never the bytes it read).

What this does not see: a server that serves several names under one certificate, or an HTTP/2 ``:authority`` or
HTTP/1 ``Host`` inside the TLS connection (encrypted: the name in the ClientHello is all the proxy can read).
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass

from worker.addresses import is_address
from worker.egress.policy import Target, TunnelRefused

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
CLIENT_HELLO = 1
SERVER_NAME_EXTENSION = 0
HOST_NAME = 0
HIDING_EXTENSIONS = {0xFE0D: "encrypted_client_hello", 0xFFCE: "encrypted_server_name"}
"""Extensions that carry the server name a ClientHello is really for encrypted, under an outer name: refused."""
_MALFORMED = "a malformed TLS ClientHello"


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
                            limit: int = HELLO_BYTES) -> bytes:
    """The first bytes of a tunnel to ``target``, read from ``reader`` within ``seconds``: the TLS records that hold
    its ClientHello, when that hello may go to ``target``; ``TunnelRefused`` (naming ``target``) otherwise.
    ``asyncio.IncompleteReadError`` when the client ends the tunnel before sending anything (it asked nothing)."""
    try:
        data, hello = await asyncio.wait_for(_read(reader, limit), seconds)
    except TimeoutError:
        raise TunnelRefused(f"the tunnel to {target.named} sent no TLS ClientHello within {seconds:g} s",
                            target.named) from None
    except ValueError as exc:
        raise TunnelRefused(f"the tunnel to {target.named} did not begin with a TLS ClientHello it may carry: {exc}",
                            target.named) from None
    why = hello.refusal(target.address[0])
    if why is not None:
        raise TunnelRefused(f"the tunnel to {target.named} was closed: {why}", target.named)
    return data


async def _read(reader: asyncio.StreamReader, limit: int) -> tuple[bytes, ClientHello]:
    """Read exactly what ``client_hello`` asks for until it has the hello; ``ValueError`` as it."""
    data = b""
    while isinstance(found := client_hello(data, limit), int):
        try:
            data += await reader.readexactly(found)
        except asyncio.IncompleteReadError as exc:
            if data or exc.partial:
                raise ValueError("the tunnel ended inside its ClientHello") from None
            raise
    return data, found


def client_hello(data: bytes, limit: int = HELLO_BYTES) -> ClientHello | int:
    """The ClientHello the TLS records at the start of ``data`` hold, or how many more bytes are needed to read
    on (exactly: the rest of a record header or record, never past the record that ends the hello); ``ValueError``
    when they cannot hold one, or would take more than ``limit`` bytes."""
    message = b""
    offset = records = 0
    while True:
        if records == MAX_HELLO_RECORDS:
            raise ValueError(f"a ClientHello in more than {MAX_HELLO_RECORDS} records")
        if len(data) - offset < RECORD_HEADER_BYTES:
            return _more(data, offset + RECORD_HEADER_BYTES, limit)
        kind, major, length = data[offset], data[offset + 1], int.from_bytes(data[offset + 3:offset + 5], "big")
        if kind != HANDSHAKE_RECORD or major != 3:
            raise ValueError("the bytes are not a TLS handshake record")
        if not 0 < length <= MAX_RECORD_BYTES:
            raise ValueError("a TLS record with a bad length")
        end = offset + RECORD_HEADER_BYTES + length
        if len(data) < end:
            return _more(data, end, limit)
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


def _more(data: bytes, needed: int, limit: int) -> int:
    """How many bytes past ``data`` make ``needed`` in all; ``ValueError`` past ``limit``."""
    if needed > limit:
        raise ValueError(f"a ClientHello longer than {limit} bytes")
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


__all__ = ["HELLO_BYTES", "HIDING_EXTENSIONS", "ClientHello", "client_hello", "read_client_hello"]
