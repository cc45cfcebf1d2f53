"""``WebFetchTool`` (model-facing name ``webfetch``): one HTTP GET of a public URL, returned as text.

HTML becomes Markdown (``markdownify``, after ``<script>``, ``<style>``, ``<svg>``, ``<noscript>`` and
``<template>`` are removed); other textual types come back as they are; binary types are refused with
``UNSUPPORTED_CONTENT_TYPE`` before their body is read. Every hop — the URL and each redirect, followed here, never
by httpx — passes the tool's domain policy (``BLOCKED_URL``) and, with ``block_private_network`` (the default), the
SSRF guard of ``worker.egress.pinned`` (``SSRF_BLOCKED_URL``), and is sent to the very address that was checked. At most
``max_response_bytes`` are read from the wire (the stream is closed there), at most ``max_content_length``
characters (or the call's ``max_length``) are returned. The result is always a ``FetchResult`` dict; ``error`` holds
``CODE: detail`` when the fetch failed or was refused: ``INVALID_ARGS``, ``INVALID_URL``, ``BLOCKED_URL``,
``SSRF_BLOCKED_URL``, ``HTTP_STATUS``, ``UNSUPPORTED_CONTENT_TYPE``, ``HTTP_ERROR``.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

import httpx
from bs4 import BeautifulSoup
from markdownify import MarkdownConverter

from orchestrator.context import InvocationContext
from orchestrator.errors import ToolCallRefusedError
from orchestrator.tools.web.cache import TTLCache
from orchestrator.tools.web.urls import clean_domains, domain_permitted, parse_web_url, url_host, url_key
from orchestrator.tools.base import BaseTool
from worker.egress import AddressPolicy, Resolver, send_async
from worker.errors import AddressRefusedError

DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_USER_AGENT = "trpc-agent-python-webfetch/1.0"
DEFAULT_MAX_CONTENT_CHARS = 100_000
DEFAULT_MAX_RESPONSE_BYTES = 5 * 1024 * 1024
DEFAULT_MAX_REDIRECTS = 5
DEFAULT_CACHE_TTL_SECONDS = 15 * 60.0
DEFAULT_CACHE_MAX_BYTES = 50 * 1024 * 1024
SNIFF_BYTES = 4096  # how much of an untyped body is looked at for NUL bytes

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
TEXT_TYPES = frozenset({
    "application/json", "application/ld+json", "application/xml", "application/yaml", "application/x-yaml",
    "application/javascript", "application/rss+xml", "application/atom+xml",
})
NON_CONTENT_TAGS = ("script", "style", "svg", "noscript", "template", "iframe", "object", "embed")

DESCRIPTION = """\
Fetch one public web page (absolute http or https URL) and return its text: HTML as Markdown, other text types as \
they are. Binary content (PDF, images, archives) is refused. Long content is cut (see max_length). Private, \
loopback and cloud-metadata addresses are refused, and the tool's domain policy applies to every redirect. \
When the result has an `error`, tell the user the error code and why instead of inventing content."""


@dataclass
class FetchResult:
    """What one ``webfetch`` call returns (as a dict)."""

    url: str = ""
    status_code: int = 0
    status_text: str = ""
    content_type: str = ""
    content: str = ""
    bytes: int = 0
    duration_ms: int = 0
    cached: bool = False
    error: str = ""


def html_to_markdown(html: str) -> str:
    """Readable Markdown of an HTML page, without scripts, styles, SVG and other non-content blocks."""
    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(NON_CONTENT_TAGS):
        tag.decompose()
    text = MarkdownConverter(heading_style="ATX", strip=["img"]).convert_soup(soup)
    lines, blank = [], False
    for line in text.splitlines():
        line = line.rstrip()
        if line or not blank:
            lines.append(line)
        blank = not line
    return "\n".join(lines).strip()


def media_type(header: str) -> str:
    return header.split(";", 1)[0].strip().lower()


def is_textual(kind: str) -> bool:
    return kind.startswith("text/") or kind in TEXT_TYPES or kind.endswith(("+json", "+xml"))


class WebFetchTool(BaseTool):
    """Fetch a single URL for the model; constructor options as in the tools guide.

    ``private_hosts`` and ``resolver`` are ours, for tests and private deployments: host names allowed to resolve
    to private addresses (none by default), and the blocking ``(host, port) -> addresses`` lookup used instead of
    the system resolver. Neither can be set by the model.
    """

    def __init__(
        self,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        user_agent: str = DEFAULT_USER_AGENT,
        proxy: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        max_content_length: int = DEFAULT_MAX_CONTENT_CHARS,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        allowed_domains: list[str] | None = None,
        blocked_domains: list[str] | None = None,
        block_private_network: bool = True,
        follow_redirects: bool = True,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        enable_cache: bool = False,
        cache_ttl_seconds: float = DEFAULT_CACHE_TTL_SECONDS,
        cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES,
        filters_name: list[str] | None = None,
        filters: list | None = None,
        private_hosts: Iterable[str] | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        super().__init__(name="webfetch", description=DESCRIPTION, filters_name=filters_name, filters=filters)
        self.timeout = float(timeout)
        self.user_agent = user_agent
        self.proxy = proxy
        self.http_client = http_client
        self.max_content_length = max(0, int(max_content_length))
        self.max_response_bytes = max(0, int(max_response_bytes))
        self.allowed_domains = clean_domains(allowed_domains)
        self.blocked_domains = clean_domains(blocked_domains)
        self.follow_redirects = bool(follow_redirects)
        self.max_redirects = max(0, int(max_redirects))
        self._ssl_context: ssl.SSLContext | None = None
        self.policy = AddressPolicy.build(bool(block_private_network), private_hosts, resolver)
        self.cache: TTLCache[FetchResult] | None = (
            TTLCache(ttl_seconds=cache_ttl_seconds, max_bytes=cache_max_bytes) if enable_cache else None
        )

    def parameters_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "Absolute http(s) URL to fetch, scheme included, e.g. "
                        "'https://docs.python.org/3/whatsnew/3.13.html'."},
                "max_length": {"type": "integer", "minimum": 0, "description": "Most characters of content to "
                               f"return this time (0: no limit); default {self.max_content_length}."},
            },
            "required": ["url"],
        }

    async def _run_async_impl(self, *, tool_context: InvocationContext, args: dict[str, Any]) -> Any:
        unexpected = sorted(set(args) - {"url", "max_length"})
        if unexpected:  # the domain lists and the SSRF guard are the tool's, never the model's
            return {"error": f"INVALID_ARGS: unexpected argument(s): {', '.join(unexpected)}"}
        raw, cap = args.get("url"), args.get("max_length")
        if cap is None:  # left out, or sent as null
            cap = self.max_content_length
        if not isinstance(raw, str) or not raw.strip():
            return {"error": "INVALID_ARGS: `url` must be a non-empty string"}
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            return {"url": raw, "error": "INVALID_ARGS: `max_length` must be a non-negative integer"}
        url = parse_web_url(raw)
        if url is None:
            return asdict(FetchResult(url=raw, error=f"INVALID_URL: {raw!r} is not an absolute http(s) URL"))
        key = url_key(raw)
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is not None:
            result = replace(hit, cached=True, duration_ms=0)
        else:
            result = await self._fetch(url, raw)
            if self.cache is not None and not result.error:
                self.cache.put(key, result, result.bytes)
        if not result.error and cap and len(result.content) > cap:
            result = replace(result, content=result.content[:cap])
            result.bytes = len(result.content.encode())
        return asdict(result)

    async def _fetch(self, url: httpx.URL, raw: str) -> FetchResult:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):  # the whole call: lookups, hops and a slowly dripping body
                if self.http_client is not None:
                    result = await self._follow(self.http_client, url)
                else:
                    async with self._client() as client:
                        result = await self._follow(client, url)
        except ToolCallRefusedError as exc:
            result = FetchResult(url=raw, error=str(exc))
        except httpx.HTTPError as exc:
            result = FetchResult(url=raw, error=f"HTTP_ERROR: {type(exc).__name__}: {exc}")
        except TimeoutError:
            result = FetchResult(url=raw, error=f"HTTP_ERROR: the fetch took longer than {self.timeout:g} s")
        result.duration_ms = int((time.monotonic() - started) * 1000)
        return result

    def _client(self) -> httpx.AsyncClient:
        """The client of one call: ``proxy`` only (proxy variables in the environment are not read, so which hops
        are tunnelled is known here); CA bundles from ``SSL_CERT_FILE``/``SSL_CERT_DIR`` still count."""
        if self._ssl_context is None:
            self._ssl_context = httpx.create_ssl_context()
        return httpx.AsyncClient(proxy=self.proxy, trust_env=False, verify=self._ssl_context)

    async def _follow(self, client: httpx.AsyncClient, url: httpx.URL) -> FetchResult:
        """Each hop checked and sent through ``send_async``; the last one read into a result."""
        for hop in range(self.max_redirects + 1):
            host = url_host(url)
            if not domain_permitted(host, self.allowed_domains, self.blocked_domains):
                raise ToolCallRefusedError(f"BLOCKED_URL: {host!r} is not permitted by the tool's domain policy")
            tunnelled = self.proxy is not None and self.http_client is None and url.scheme == "https"
            try:
                response = await send_async(client, url, {"User-Agent": self.user_agent}, self.policy, self.timeout,
                                            tunnelled=tunnelled)
            except AddressRefusedError as exc:
                raise ToolCallRefusedError(f"SSRF_BLOCKED_URL: {exc}") from None
            try:
                location = response.headers.get("location") if response.is_redirect else None
                if location is None or not self.follow_redirects:
                    return await self._read(response, url)
            finally:
                await response.aclose()
            target = parse_web_url(str(url.join(location)))
            if target is None:
                raise ToolCallRefusedError(f"INVALID_URL: redirect to {location!r}, which is not an http(s) URL")
            url = target
        raise ToolCallRefusedError(f"HTTP_ERROR: more than {self.max_redirects} redirects")

    async def _read(self, response: httpx.Response, url: httpx.URL) -> FetchResult:
        kind = media_type(response.headers.get("content-type", ""))
        result = FetchResult(url=str(url), status_code=response.status_code,
                             status_text=response.reason_phrase, content_type=kind)
        if not response.is_success:
            result.error = f"HTTP_STATUS: {response.status_code} {response.reason_phrase}".rstrip()
            return result
        if kind and kind not in HTML_TYPES and not is_textual(kind):
            result.error = f"UNSUPPORTED_CONTENT_TYPE: {kind}"
            return result
        body = await self._read_capped(response)
        if not kind and b"\x00" in body[:SNIFF_BYTES]:
            result.error = "UNSUPPORTED_CONTENT_TYPE: no Content-Type and the body looks binary"
            return result
        text = body.decode(response.encoding or "utf-8", errors="replace")
        result.content = html_to_markdown(text) if kind in HTML_TYPES else text
        result.bytes = len(result.content.encode())
        return result

    async def _read_capped(self, response: httpx.Response) -> bytes:
        """At most ``max_response_bytes`` of the body (decoded from any Content-Encoding); the rest is never read."""
        limit, body = self.max_response_bytes, bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if limit and len(body) >= limit:
                del body[limit:]
                break
        return bytes(body)
