"""One HTTP hop sent only to an address that was checked: the web tools' SSRF guard.

The host is resolved once (``worker.egress.addresses.resolve``) and, while private networks are blocked, every address it
got must be public (``worker.egress.addresses.is_public``: loopback, private, link-local with the cloud metadata endpoint,
shared, reserved, multicast and the IPv6 forms that carry such an IPv4 address are refused; integer, octal and hex
spellings of an IPv4 host resolve to the address they mean and are vetted as that). The request then goes to one
of those very addresses: the address is put in the request URL, the name in the ``Host`` header and as the TLS
server name, so certificates are still verified against the name and no second lookup can send the connection
elsewhere (DNS rebinding). This works through any HTTP/1.1 ``httpx.AsyncClient``, a caller's shared one and one with a
plain-HTTP proxy included, because nothing below httpx's public request API is changed. (A client with
``http2=True`` would keep an HTTP/2 connection open for reuse under the bare address; don't share one with the web
tools. HTTPS through a CONNECT proxy is the exception ``send_pinned(tunnelled=True)`` describes.)
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import httpx

from worker.egress.addresses import is_public, resolve

Resolver = Callable[[str, int], list[str]]
"""``(host, port) -> addresses``, blocking; called once per hop, in a thread."""


class AddressRefused(Exception):
    """A hop's host resolves to an address the policy refuses (or to none)."""


@dataclass(frozen=True)
class AddressPolicy:
    """Which addresses a hop may connect to.

    ``private_hosts`` names hosts that may resolve to private addresses (a test server, an intranet site of a
    private deployment); the connection still goes to the address that was resolved. Empty by default.
    """

    block_private_network: bool = True
    private_hosts: frozenset[str] = field(default_factory=frozenset)
    resolver: Resolver = resolve

    @classmethod
    def build(cls, block_private_network: bool, private_hosts: Iterable[str] | None, resolver: Resolver | None):
        return cls(block_private_network, frozenset(h.strip().lower() for h in private_hosts or ()), resolver or resolve)

    async def addresses(self, host: str, port: int) -> list[str]:
        """The vetted addresses of ``host``, in the resolver's order."""
        try:
            addresses = await asyncio.to_thread(self.resolver, host, port)
        except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
            raise AddressRefused(f"{host} does not resolve ({exc})") from None
        if not addresses:
            raise AddressRefused(f"{host} has no address")
        if self.block_private_network and host.lower() not in self.private_hosts:
            for address in addresses:
                if not _public(address):
                    raise AddressRefused(f"{host} resolves to private/reserved address {address}")
        return addresses


def _public(address: str) -> bool:
    try:
        return is_public(ipaddress.ip_address(address.split("%")[0]))
    except ValueError:  # a resolver's answer that is not an address
        return False


async def send_pinned(
    client: httpx.AsyncClient, url: httpx.URL, headers: Mapping[str, str], timeout: float, policy: AddressPolicy,
    *, tunnelled: bool = False,
) -> httpx.Response:
    """``GET url`` as a stream, connected to an address ``policy`` vetted; redirects are not followed.

    ``tunnelled``: the client reaches ``url`` through a CONNECT proxy (HTTPS through ``proxy``). httpcore names the
    tunnel's TLS server after the URL's host, so the address cannot go in the URL: the name is vetted here and
    sent as it is, and the proxy resolves it again — through a proxy, DNS rebinding is the proxy's to stop.
    """
    if not policy.block_private_network:
        request = client.build_request("GET", url, headers=headers, timeout=timeout)
        return await client.send(request, stream=True, follow_redirects=False)
    host = url.raw_host.decode("ascii")
    addresses = await policy.addresses(host, url.port or (443 if url.scheme == "https" else 80))
    if tunnelled:
        request = client.build_request("GET", url, headers=headers, timeout=timeout)
        return await client.send(request, stream=True, follow_redirects=False)
    pinned_headers = {**headers, "Host": url.netloc.decode("ascii")}
    extensions = {}
    if url.scheme == "https":
        # The client's pool knows this connection by the address alone: closed after the response, it is never
        # reused for another name at that address, whose certificate it was not checked against.
        extensions["sni_hostname"] = host
        pinned_headers["Connection"] = "close"
    failure: httpx.ConnectError | None = None
    for address in addresses:  # in the resolver's order, as a connection to the name would try them
        request = client.build_request(
            "GET", url.copy_with(host=address), headers=pinned_headers, timeout=timeout, extensions=extensions,
        )
        try:
            return await client.send(request, stream=True, follow_redirects=False)
        except httpx.ConnectError as exc:
            failure = exc
    assert failure is not None
    raise failure


__all__ = ["AddressPolicy", "AddressRefused", "Resolver", "send_pinned"]
