"""What a sandbox may ask of its egress proxy (``worker.egress.proxy``): the allow-list of hosts it may reach,
and the request heads the proxy reads, with the refusals it answers.

The allow-list (``AllowList``) of a build step is made per step from the index the step's environment names
(``INDEX_VARIABLE``; PyPI's two hosts without it) and the operator's ``SKILLRUN_ENV_ALLOWED_HOSTS``; a run's from
the entries its request carries (``run_allow_list``), wildcards (``*.example.com``)
included. A request head (``Request``) is either ``CONNECT host:port`` or a plain-HTTP ``GET``/``HEAD`` with an
absolute ``http://`` URI, no body, and no ``Host`` header naming another host or port than that URI (domain
fronting; a missing one is set to the URI's), with no control character but a tab in any of its lines (a CR or LF
outside the CRLF that ends a line, NUL, DEL: a server beyond the proxy could read lines, and so headers, that the
proxy did not); anything else is ``EgressRefusedError`` with an HTTP status and a reason the build's own error message will
show. A tunnel whose first bytes are not what it may carry (``worker.egress.tls``) is ``TunnelRefusedError``: its ``200``
was sent, so it is closed without an answer.

What a refusal reports (``EgressRefusedError.destination``, and in a run's result ``RunResult.egress_refusals``) is the
destination alone, ``host:port`` as the request named it (``Target.named``: the host's case and spelling kept, so
that the result's redaction finds a secret used as a host name), or ``MALFORMED`` when no host could be read; a
refusal's reason names at most that, never the request's path, query, headers or raw target, so that nothing of
those (a token in a query string, say) reaches the result. Its ``kind`` names what was refused in the proxy's own
fixed words, nothing of the request's: what the worker's log shows.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from worker.config import get_worker_settings
from worker.errors import DependencyError, WorkerError
from worker.names import parse_entries

INDEX_VARIABLE = "UV_DEFAULT_INDEX"
"""Where a step's environment names the index it uses (PyPI without it): what its allow-list is made from."""
REGISTRY_VARIABLE = "npm_config_registry"
"""Where a Node build step's environment names the npm registry it uses (its one host is the step's index)."""
PYPI_HOSTS = (("pypi.org", 443), ("files.pythonhosted.org", 443))
"""The default index's hosts: its pages, and the files they link to."""
DEFAULT_PORTS = {"http": 80, "https": 443}
ALLOWED_HOSTS_SETTING = "SKILLRUN_ENV_ALLOWED_HOSTS"
RUN_HINT = ("A run reaches only the hosts its skill declares (metadata.egress) that its team's egress allow-list "
            "also has ({allowed}); the operator sets the team's list with: skillrun egress set TEAM ENTRY...")
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")
_DROPPED_HEADERS = frozenset({"proxy-connection", "proxy-authorization"})
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""Characters no request line or header line may hold (a tab may; CRLF ends each line)."""
_NAMED_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"})
"""Methods a refusal names (any other method's text is the client's own, and is not repeated)."""
MALFORMED = "(malformed request)"
"""A refusal's destination when the request named no host that could be read."""

Address = tuple[str, int]


@dataclass(frozen=True)
class AllowList:
    """The hosts and ports a sandbox may reach: ``hosts`` by name, and every name under a ``suffixes`` entry
    (``(".example.com", 443)`` for ``*.example.com``); those of ``index`` (a build's index) may have private
    addresses. ``hint`` ends a refusal's message: what the sandbox may reach, and who may change it."""

    hosts: frozenset[Address]
    index: frozenset[Address]
    suffixes: frozenset[Address] = frozenset()
    hint: str = ""

    def allows(self, destination: Address) -> bool:
        host, port = destination
        return destination in self.hosts or any(
            port == allowed and host.endswith(suffix) for suffix, allowed in self.suffixes)

    @classmethod
    def for_step(cls, env: Mapping[str, str], allowed_hosts: str | None = None) -> AllowList:
        """What a step with the environment ``env`` may reach: the index it names (``INDEX_VARIABLE``), or the npm
        registry (``REGISTRY_VARIABLE``), and ``allowed_hosts`` (default: the worker's
        ``SKILLRUN_ENV_ALLOWED_HOSTS``)."""
        if allowed_hosts is None:
            allowed_hosts = get_worker_settings().env_allowed_hosts
        return cls.for_index(env.get(INDEX_VARIABLE) or env.get(REGISTRY_VARIABLE), allowed_hosts)

    @classmethod
    def for_index(cls, index_url: str | None, allowed_hosts: str = "") -> AllowList:
        """The index of ``index_url`` (PyPI's hosts when ``None``) and the operator's ``allowed_hosts``
        (``host[:port]`` items, port 443 unless given, separated by commas or spaces)."""
        extra = set()
        for item in filter(None, re.split(r"[,\s]+", allowed_hosts)):
            try:
                extra.add(split_authority(item, 443))
            except ValueError as exc:
                raise DependencyError(
                    f"{ALLOWED_HOSTS_SETTING} has a bad entry {item!r} ({exc}): list host names or addresses, each "
                    "with an optional port (443 unless given), separated by commas, such as 'mirror.example.org, "
                    "files.example.org:8443'"
                ) from None
        if not index_url:
            return cls(frozenset(extra | set(PYPI_HOSTS)), frozenset(PYPI_HOSTS))
        parts = urlsplit(index_url)
        try:
            if parts.scheme not in DEFAULT_PORTS:
                raise ValueError("not an http:// or https:// URL")
            index = split_authority(parts.netloc.rpartition("@")[2], DEFAULT_PORTS[parts.scheme])
        except ValueError as exc:
            raise DependencyError(
                f"the package index URL {index_url!r} cannot be used ({exc}): set SKILLRUN_ENV_INDEX_URL to the "
                "index's http:// or https:// URL"
            ) from None
        return cls(frozenset(extra | {index}), frozenset({index}))

    def describe(self) -> str:
        return ", ".join(sorted([f"{host}:{port}" for host, port in self.hosts]
                                + [f"*{suffix}:{port}" for suffix, port in self.suffixes]))

    def refusal_hint(self) -> str:
        return self.hint or (f"A build reaches only its package index ({self.describe()}); an operator may allow "
                             f"more hosts with {ALLOWED_HOSTS_SETTING}.")


def effective(declared: Iterable[str], team: Iterable[str]) -> list[str]:
    """What a run of a skill declaring ``declared`` may reach, its team allowing ``team``: each destination both
    allow (the narrower entry of each pair where one covers the other), as entry texts."""
    skill_entries, team_entries = parse_entries(declared), parse_entries(team)
    both = {mine for mine in skill_entries if any(theirs.covers(mine) for theirs in team_entries)}
    both |= {theirs for theirs in team_entries if any(mine.covers(theirs) for mine in skill_entries)}
    return sorted(str(entry) for entry in both)


def run_allow_list(texts: Iterable[str]) -> AllowList:
    """The proxy's allow-list for a run whose request carries the entries ``texts``."""
    entries = parse_entries(texts)
    allowed = AllowList(frozenset((e.host, e.port) for e in entries if not e.wildcard), frozenset(),
                        frozenset(("." + e.host, e.port) for e in entries if e.wildcard))
    return AllowList(allowed.hosts, allowed.index, allowed.suffixes, RUN_HINT.format(allowed=allowed.describe()))


def split_authority(text: str, default_port: int | None) -> Address:
    """``host[:port]`` (an IPv6 address in brackets) as a normalised host name or address and a port;
    ``ValueError`` when it is anything else (its message does not repeat ``text``, which may hold anything)."""
    if not text or any(char in text for char in "@/?#\\ \t"):
        raise ValueError("not host[:port]")
    parts = urlsplit("//" + text)
    try:
        port = parts.port if parts.port is not None else default_port
    except ValueError:
        raise ValueError("a port that is not a number in 1-65535") from None
    if port is None or port == 0:
        raise ValueError("no port")
    host = (parts.hostname or "").rstrip(".")
    try:
        return str(ipaddress.ip_address(host)), port
    except ValueError:
        pass
    if len(host) > 253 or not _NAME.fullmatch(host):
        raise ValueError("not a host name or address")
    return host, port


@dataclass(frozen=True)
class Target:
    """Where a request goes: ``address``, its host normalised (lower case, no final dot, an address in its usual
    form: what the allow-list is checked against and the proxy connects to), and ``named``, ``host:port`` as the
    request named it (the host's spelling kept, the port its own or the default: what a refusal reports)."""

    address: Address
    named: str

    @classmethod
    def read(cls, text: str, default_port: int | None) -> Target:
        """The target ``host[:port]`` names; ``ValueError`` as ``split_authority``."""
        address = split_authority(text, default_port)
        host = text[:text.index("]") + 1] if text.startswith("[") else text.partition(":")[0]
        return cls(address, f"{host}:{address[1]}")


class EgressRefusedError(WorkerError):
    """A request the proxy does not carry out: the HTTP status it answers with, why (``why`` names at most the
    destination, never the request's path, query, headers or raw target), and ``kind``, what was refused in a few
    fixed words of the proxy's (nothing of the request's, the destination neither)."""

    def __init__(self, status: int, reason: str, why: str, destination: str = MALFORMED, *, kind: str) -> None:
        super().__init__(why)
        self.status = status
        self.reason = reason
        self.destination = destination
        """What was asked for: ``Target.named``, or ``MALFORMED`` when the request named no host that could be
        read."""
        self.kind = kind
        """What was refused, in the proxy's own words ("not on the allow-list"): all the worker's log says of it."""

    def response(self, allowed: AllowList) -> bytes:
        body = f"skillrun: {self}. {allowed.refusal_hint()}\n".encode()
        return (f"HTTP/1.1 {self.status} {self.reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n").encode() + body


class TunnelRefusedError(EgressRefusedError):
    """A tunnel the proxy opened (its ``200`` sent) and then ends for what its client sent first (or its server
    answered that, or the client sent after a HelloRetryRequest): no HTTP answer can follow, so the connection is
    closed without one."""

    def __init__(self, why: str, destination: str, *, kind: str) -> None:
        super().__init__(403, "Forbidden", why, destination, kind=kind)

    def response(self, allowed: AllowList) -> bytes:
        return b""


@dataclass(frozen=True)
class Request:
    """A request head: its line, and its headers in order."""

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, head: bytes) -> Request:
        """The request ``head`` (up to and with its blank line) holds; ``EgressRefusedError`` (400) for a head that is no
        HTTP/1 request, has a malformed header line, or holds a control character other than a tab in any line
        (a CR or LF outside the CRLF that ends it, NUL, DEL)."""
        text = head.decode("latin-1")
        if _CONTROL.search(text.replace("\r\n", "")):
            raise EgressRefusedError(400, "Bad Request", "a request head holding a control character (a CR or LF outside a "
                          "line's CRLF, NUL, DEL, ...)", kind="malformed request")
        lines = text.split("\r\n")
        words = lines[0].split(" ")
        if len(words) != 3 or not words[2].startswith("HTTP/1."):
            raise EgressRefusedError(400, "Bad Request", "not an HTTP/1 request", kind="malformed request")
        headers = []
        for line in filter(None, lines[1:]):
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise EgressRefusedError(400, "Bad Request", "a malformed header", kind="malformed request")
            headers.append((name, value.strip()))
        return cls(words[0], words[1], words[2], tuple(headers))

    def tunnel(self) -> Target:
        """Where a ``CONNECT`` goes; ``EgressRefusedError`` when its target is not ``host:port``."""
        try:
            return Target.read(self.target, None)
        except ValueError as exc:
            raise EgressRefusedError(400, "Bad Request", f"the CONNECT target is not host:port ({exc})",
                          kind="malformed CONNECT target") from None

    def destination(self) -> Target:
        """Where a plain-HTTP request goes (its absolute URI's host and port); ``EgressRefusedError`` for a request the proxy
        does not forward: anything but a read without a body (what uv asks of an index), or one whose ``Host``
        header names another host or port (domain fronting: the origin would serve that other host). Each
        refusal names the URI's host where it could be read."""
        target = self._uri_target()
        if self.method not in ("GET", "HEAD"):
            method = self.method if self.method in _NAMED_METHODS else "this method"
            raise EgressRefusedError(405, "Method Not Allowed", f"{method} is not forwarded to {target.named} over plain HTTP "
                          "(GET and HEAD are; use HTTPS, through a CONNECT tunnel)", target.named,
                          kind="method not forwarded")
        if any(name.lower() == "transfer-encoding" or (name.lower() == "content-length" and value != "0")
               for name, value in self.headers):
            raise EgressRefusedError(400, "Bad Request", f"a request to {target.named} with a body is not forwarded",
                          target.named, kind="request with a body")
        hosts = [value for name, value in self.headers if name.lower() == "host"]
        if len(hosts) > 1:
            raise EgressRefusedError(400, "Bad Request", f"a request to {target.named} with more than one Host header",
                          target.named, kind="malformed Host header")
        try:
            fronted = bool(hosts) and split_authority(hosts[0], DEFAULT_PORTS["http"]) != target.address
        except ValueError:
            raise EgressRefusedError(400, "Bad Request", f"a request to {target.named} whose Host header is not host[:port]",
                          target.named, kind="malformed Host header") from None
        if fronted:
            raise EgressRefusedError(403, "Forbidden", f"a request to {target.named} whose Host header names another host or "
                          "port (domain fronting)", target.named,
                          kind="Host header naming another host (domain fronting)")
        return target

    def _uri_target(self) -> Target:
        """The absolute ``http://`` URI's host and port; ``EgressRefusedError`` for any other target."""
        try:
            parts = urlsplit(self.target)
            target = Target.read(parts.netloc, DEFAULT_PORTS[parts.scheme])
        except (KeyError, ValueError):
            raise EgressRefusedError(400, "Bad Request", "a plain request needs an absolute http:// URI with a host",
                          kind="not an absolute http:// URI") from None
        if parts.scheme != "http":
            raise EgressRefusedError(400, "Bad Request", f"a plain request to {target.named} needs an http:// URI (https:// goes "
                          "through a CONNECT tunnel)", target.named, kind="not an http:// URI")
        return target

    def forwarded(self) -> bytes:
        """The head as the origin server gets it: the target's path and query alone, no ``Proxy-*`` headers, a
        ``Host`` header (the URI's authority when the client sent none)."""
        parts = urlsplit(self.target)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"{self.method} {target} {self.version}"]
        lines += [f"{name}: {value}" for name, value in self.headers if name.lower() not in _DROPPED_HEADERS]
        if not any(name.lower() == "host" for name, _ in self.headers):
            lines.append(f"Host: {parts.netloc}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


__all__ = ["ALLOWED_HOSTS_SETTING", "INDEX_VARIABLE", "MALFORMED", "PYPI_HOSTS", "Address", "AllowList", "EgressRefusedError",
           "Request", "Target", "TunnelRefusedError", "effective", "run_allow_list", "split_authority"]
