"""One HTTP hop sent only to an address that was checked: the guard against server-side request forgery and DNS
rebinding that library downloads (``worker.roots.downloads``, sync) and the web tools
(``orchestrator.tools.web.fetch``, async) share.

The host is resolved once and, while private networks are blocked, every address it got must be public
(``worker.egress.addresses.is_public``: loopback, private, link-local with the cloud metadata endpoint, shared,
reserved, multicast and the IPv6 forms that carry such an IPv4 address are refused; integer, octal and hex
spellings of an IPv4 host resolve to the address they mean and are vetted as that). The request then goes to one
of those very addresses: the address in the request URL, the name in the ``Host`` header and as the TLS server
name, so certificates are still verified against the name and no second lookup can send the connection elsewhere.
Over HTTPS the connection is closed after the response: the client's pool knows it by the address alone, and must
never reuse it for another name at that address, whose certificate it was not checked against. Redirects are not
followed here: each hop is its caller's, and is vetted again. This works through any HTTP/1.1 httpx client, a
plain-HTTP proxy included, because nothing below httpx's public request API is changed.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import httpx

from worker.egress.addresses import is_public, resolve
from worker.errors import AddressRefusedError

Resolver = Callable[[str, int], list[str]]
"""``(host, port) -> addresses``, blocking; called once per hop (in a thread by ``send_async``)."""


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
    def build(cls, block_private_network: bool, private_hosts: Iterable[str] | None = None,
              resolver: Resolver | None = None) -> AddressPolicy:
        return cls(block_private_network, frozenset(h.strip().lower() for h in private_hosts or ()), resolver or resolve)

    def vet(self, url: httpx.URL) -> list[str] | None:
        """The vetted addresses of ``url``'s host, in the resolver's order; ``None`` when any address may be reached
        (the request then goes to the name). Blocking: one lookup."""
        if not self.block_private_network:
            return None
        host = url.raw_host.decode("ascii")
        try:
            addresses = self.resolver(host, url.port or (443 if url.scheme == "https" else 80))
        except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
            raise AddressRefusedError(host, None, f"{host} does not resolve ({exc})") from None
        if not addresses:
            raise AddressRefusedError(host, None, f"{host} has no address")
        if host.lower() not in self.private_hosts:
            for address in addresses:
                if not _public(address):
                    raise AddressRefusedError(host, address, f"{host} resolves to private/reserved address {address}")
        return addresses


def _public(address: str) -> bool:
    try:
        return is_public(ipaddress.ip_address(address.split("%")[0]))
    except ValueError:  # a resolver's answer that is not an address
        return False


def pinned_requests(
    client: httpx.Client | httpx.AsyncClient, url: httpx.URL, headers: Mapping[str, str], addresses: list[str] | None,
    timeout: float | httpx.Timeout | object = httpx.USE_CLIENT_DEFAULT, *, tunnelled: bool = False,
) -> list[httpx.Request]:
    """The requests that send ``GET url`` to one of ``addresses`` (``AddressPolicy.vet``'s answer), to be tried in
    order until one connects.

    ``tunnelled``: the client reaches ``url`` through a CONNECT proxy (HTTPS through a proxy). httpcore names the
    tunnel's TLS server after the URL's host, so the address cannot go in the URL: the name was vetted and is sent
    as it is, and the proxy resolves it again — through a proxy, DNS rebinding is the proxy's to stop.
    """
    if addresses is None or tunnelled:
        return [client.build_request("GET", url, headers=headers, timeout=timeout)]
    pinned_headers = {**headers, "Host": url.netloc.decode("ascii")}
    extensions = {}
    if url.scheme == "https":
        extensions["sni_hostname"] = url.raw_host.decode("ascii")
        pinned_headers["Connection"] = "close"
    return [client.build_request("GET", url.copy_with(host=address), headers=pinned_headers, timeout=timeout,
                                 extensions=extensions) for address in addresses]


def send(client: httpx.Client, url: httpx.URL, headers: Mapping[str, str], policy: AddressPolicy,
         timeout: float | httpx.Timeout | object = httpx.USE_CLIENT_DEFAULT) -> httpx.Response:
    """``GET url`` as a stream, connected to an address ``policy`` vetted; redirects are not followed."""
    failure: httpx.ConnectError | None = None
    for request in pinned_requests(client, url, headers, policy.vet(url), timeout):
        try:
            return client.send(request, stream=True, follow_redirects=False)
        except httpx.ConnectError as exc:  # the next address, as a connection to the name would try it
            failure = exc
    assert failure is not None
    raise failure


async def send_async(
    client: httpx.AsyncClient, url: httpx.URL, headers: Mapping[str, str], policy: AddressPolicy,
    timeout: float | httpx.Timeout | object = httpx.USE_CLIENT_DEFAULT, *, tunnelled: bool = False,
) -> httpx.Response:
    """``send`` for an async client; the lookup runs in a thread."""
    addresses = await asyncio.to_thread(policy.vet, url)
    failure: httpx.ConnectError | None = None
    for request in pinned_requests(client, url, headers, addresses, timeout, tunnelled=tunnelled):
        try:
            return await client.send(request, stream=True, follow_redirects=False)
        except httpx.ConnectError as exc:
            failure = exc
    assert failure is not None
    raise failure


__all__ = ["AddressPolicy", "Resolver", "pinned_requests", "send", "send_async"]
