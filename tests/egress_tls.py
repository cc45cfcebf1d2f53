"""TLS for the egress tests: a certificate for a host, an origin beyond the proxy that records what reaches it (plain
HTTP and HTTPS on one port; ``tls_origin``: the allowed host ``ALLOWED``, its name pinned to it), and ClientHellos —
real ones from Python's ``ssl`` module, and crafted ones it cannot make (Encrypted Client Hello, two server names,
one hello in several records). Everything stays on loopback."""

from __future__ import annotations

import datetime
import socket
import socketserver
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.egress_hosts import ALLOWED
from worker.config import get_worker_settings

ENCRYPTED_CLIENT_HELLO = 0xFE0D
SERVER_NAME = 0


def certificate(folder: Path, host: str) -> tuple[Path, Path]:
    """A self-signed certificate (its own CA) for ``host`` and its key, in ``folder`` (the certificate readable by
    sandbox users, to trust it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / f"{host}.pem", folder / f"{host}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.chmod(0o644)
    return cert_path, key_path


class Origin(socketserver.ThreadingTCPServer):
    """A host beyond the proxy, on 127.0.0.1: HTTPS when a connection's first byte opens a TLS record, plain HTTP
    otherwise; each request is answered ``reached <path>`` (``over TLS`` when it was), the connection kept alive
    unless the request asks for ``Connection: close``. It records the first byte of every connection (``b""`` for
    one that carried nothing), the server name of every TLS hello, and every request head it read."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, cert: Path, key: Path) -> None:
        super().__init__(("127.0.0.1", 0), _OriginHandler)
        self.cert = cert
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.context.sni_callback = lambda tls, name, context: self.server_names.append(name)
        self.firsts: list[bytes] = []
        self.server_names: list[str | None] = []
        self.heads: list[bytes] = []
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()

    def reached(self) -> bool:
        """Whether any byte at all reached it."""
        return any(self.firsts)


class _OriginHandler(socketserver.BaseRequestHandler):
    server: Origin

    def handle(self) -> None:
        connection = self.request
        connection.settimeout(10)
        try:
            first = connection.recv(1, socket.MSG_PEEK)
            self.server.firsts.append(first)
            tls = first == b"\x16"
            if tls:
                connection = self.server.context.wrap_socket(connection, server_side=True)
            stream = connection.makefile("rb")
            while head := _head(stream):
                self.server.heads.append(head)
                body = f"reached {head.split(b' ')[1].decode()}{' over TLS' if tls else ''}".encode()
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                if b"\r\nconnection: close\r\n" in head.lower():
                    break
        except (OSError, ssl.SSLError):
            pass


def _head(stream) -> bytes:
    """One request head from ``stream``, or ``b""`` at its end."""
    head = b""
    while line := stream.readline(65536):
        head += line
        if line == b"\r\n":
            return head
    return b""


@pytest.fixture
def tls_origin(tmp_path, monkeypatch) -> Origin:
    """The allowed host ``ALLOWED`` for one test: an ``Origin`` with a certificate for that name (``.cert``, to
    trust), the name pinned to it with ``SKILLRUN_EGRESS_PINNED_HOSTS``."""
    server = Origin(*certificate(tmp_path, ALLOWED))
    monkeypatch.setenv("SKILLRUN_EGRESS_PINNED_HOSTS", f"{ALLOWED}=127.0.0.1")
    get_worker_settings.cache_clear()
    yield server
    server.close()
    get_worker_settings.cache_clear()


def python_hello(server_name: str | None) -> bytes:
    """The first bytes Python's ``ssl`` module sends for a TLS connection to ``server_name`` (without a server name
    when it is ``None`` or an address, as ``ssl`` does)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def server_name_extension(*names: str) -> tuple[int, bytes]:
    """A ``server_name`` extension listing ``names`` (RFC 6066 allows one)."""
    entries = b"".join(b"\x00" + _vector(2, name.encode()) for name in names)
    return SERVER_NAME, _vector(2, entries)


def crafted_hello(extensions: list[tuple[int, bytes]], records: int = 1) -> bytes:
    """A TLS 1.3 ClientHello with ``extensions`` (type, content) in that order, split over ``records`` records."""
    body = (b"\x03\x03" + bytes(32) + _vector(1, b"") + _vector(2, b"\x13\x01") + _vector(1, b"\x00")
            + _vector(2, b"".join(kind.to_bytes(2, "big") + _vector(2, content) for kind, content in extensions)))
    message = b"\x01" + len(body).to_bytes(3, "big") + body
    size = -(-len(message) // records)
    return b"".join(b"\x16\x03\x01" + _vector(2, message[at:at + size]) for at in range(0, len(message), size))


def _vector(length_size: int, content: bytes) -> bytes:
    return len(content).to_bytes(length_size, "big") + content
