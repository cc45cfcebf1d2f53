"""URL helpers the web tools share: a URL's host, subdomain-aware domain lists, and a normalised key for caching
and de-duplicating URLs.

Domain matching is the guide's: case-insensitive, a leading ``www.`` stripped on both sides, and a domain matches
itself and its subdomains (``python.org`` matches ``docs.python.org``, not ``notpython.org``).
"""

from __future__ import annotations

from collections.abc import Iterable

import httpx

WEB_SCHEMES = ("http", "https")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def bare_domain(domain: str) -> str:
    """``domain`` as the lists compare it: lower case, no ``www.``, no trailing dot."""
    return domain.strip().lower().rstrip(".").removeprefix("www.")


def clean_domains(domains: Iterable[str] | None) -> tuple[str, ...]:
    """The non-empty entries of a domain list, normalised."""
    return tuple(d for d in (bare_domain(x) for x in domains or () if isinstance(x, str)) if d)


def url_host(url: httpx.URL) -> str:
    """The host of ``url`` normalised as the domain lists compare it."""
    return bare_domain(url.host)


def domain_matches(host: str, domains: Iterable[str]) -> bool:
    """Whether ``host`` (normalised) is one of ``domains`` or a subdomain of one."""
    return any(host == d or host.endswith("." + d) for d in domains)


def domain_permitted(host: str, allowed: tuple[str, ...], blocked: tuple[str, ...]) -> bool:
    """The domain policy: the block list first, then the allow list when there is one."""
    if domain_matches(host, blocked):
        return False
    return not allowed or domain_matches(host, allowed)


def parse_web_url(raw: str) -> httpx.URL | None:
    """``raw`` as an absolute http(s) URL with a host, or None."""
    try:
        url = httpx.URL(raw.strip())
    except (httpx.InvalidURL, TypeError, UnicodeError):
        return None
    if url.scheme not in WEB_SCHEMES or not url.host:
        return None
    return url


def url_key(raw: str) -> str:
    """A key under which equivalent URLs meet: scheme and host in lower case, ``www.``, the default port and a
    trailing ``/`` dropped, the query kept, the fragment dropped."""
    url = parse_web_url(raw)
    if url is None:
        return raw.strip()
    netloc = url_host(url)
    if url.port is not None and url.port != _DEFAULT_PORTS[url.scheme]:
        netloc = f"{netloc}:{url.port}"
    path = url.path.rstrip("/")
    query = f"?{url.query.decode('ascii')}" if url.query else ""
    return f"{url.scheme}://{netloc}{path}{query}"
