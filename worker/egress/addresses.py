"""Which network addresses a URL a remote caller names may reach: public ones only.

A host is resolved once (``resolve``) and every address it got is vetted; the caller then connects to one of those
very addresses (``worker.egress.pinned``, the egress proxy), so a name that resolves to a public address for the
check and to a private one for the connection (DNS rebinding) gets nowhere. An address is refused when it is not global (loopback, private, link-local, shared,
reserved, documentation…), multicast, or an IPv6 spelling of a refused IPv4 address: IPv4-mapped (``::ffff:a.b.c.d``)
and IPv4-compatible (``::a.b.c.d``) addresses, NAT64 (``64:ff9b::/96``), 6to4 (``2002::/16``). Teredo
(``2001::/32``) and local-use NAT64 (``64:ff9b:1::/48``) are refused outright: what they reach cannot be told from the
address. Host names in integer, octal or hexadecimal form (``2130706433``, ``0x7f.1``) are resolved as the C library
reads them, so they are vetted as the address they mean.
"""

from __future__ import annotations

import ipaddress
import socket

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_REFUSED_V6 = (ipaddress.ip_network("2001::/32"), ipaddress.ip_network("64:ff9b:1::/48"))  # Teredo, local NAT64


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries, for the ways that reach it."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _IPV4_COMPATIBLE or ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour




def is_public(ip: IPAddress) -> bool:
    """Whether a remote caller may make the server connect to ``ip``."""
    if isinstance(ip, ipaddress.IPv6Address):
        if any(ip in network for network in _REFUSED_V6):
            return False
        inner = _embedded_ipv4(ip)
        if inner is not None:
            return is_public(inner)
    return ip.is_global and not ip.is_multicast


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order of preference (the one lookup made)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(info[4][0] for info in infos))


def first_private(addresses: list[str]) -> str | None:
    """The first of ``addresses`` (as ``resolve`` gives them) that is not public, or ``None``."""
    return next((address for address in addresses if not is_public(ipaddress.ip_address(address.split("%")[0]))),
                None)
