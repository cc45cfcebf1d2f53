"""``WebSearchTool`` (model-facing name ``websearch``): one search through DuckDuckGo (default), Google Custom Search
or Tavily, returned as ``WebSearchResult`` — ``{query, provider, results: [{title, url, snippet}], summary}``.

The model may narrow a search with ``count``, ``lang`` and one of ``allowed_domains``/``blocked_domains``
(subdomain-aware, ``www.`` stripped); hits are filtered here too whatever the provider did, de-duplicated by a
normalised URL (``dedup_urls``) and cut to ``title_len``/``snippet_len``. Every model request the tool is declared in
gets the guide's citation rules (``process_request``). Failures are results: ``INVALID_ARGS``, ``INVALID_QUERY``,
``HTTP_ERROR`` (a transport failure, an error status, or an answer that is not the provider's JSON); a provider
without its credentials answers with no results and says so in ``summary``.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import httpx

from orchestrator.context import InvocationContext
from orchestrator.errors import OrchestratorError
from orchestrator.tools.web.providers import (
    PROVIDERS,
    DuckDuckGoProvider,
    GoogleProvider,
    Query,
    SearchHit,
    SearchProvider,
    TavilyProvider,
)
from orchestrator.tools.web.urls import clean_domains, domain_permitted, parse_web_url, url_host, url_key
from orchestrator.tools.base import BaseTool

if TYPE_CHECKING:  # annotations only: importing the models package would load the model SDK
    from orchestrator.models.base import LlmRequest

DEFAULT_TIMEOUT_SECONDS = 15.0
DEFAULT_USER_AGENT = "trpc-agent-python-websearch/1.0"
MAX_COUNT, DEFAULT_COUNT = 10, 5
MAX_SNIPPET_CHARS, DEFAULT_SNIPPET_CHARS = 1000, 300
MAX_TITLE_CHARS, DEFAULT_TITLE_CHARS = 200, 100
MIN_QUERY_CHARS = 2
MAX_ANSWER_BYTES = 4 * 1024 * 1024  # a provider's JSON answer larger than this is an error

ProviderName = Literal["duckduckgo", "google", "tavily"]

DESCRIPTION = """\
Search the public web; returns {title, url, snippet} results and, for DuckDuckGo and Tavily, a summary. Use it for \
current events, versions, releases and facts past your knowledge; prefer one well-formed query. Narrow with \
allowed_domains or blocked_domains (not both). Cite the returned URLs."""

CITATION_RULES = """\
When you use results of the websearch tool:
1. End your answer with a "Sources:" section listing the URLs the tool returned as Markdown links: [Title](URL).
2. Never invent a URL; cite only URLs the tool returned.
3. For "latest", "recent" or "current" questions, search with the current month and year ({month_year})."""


@dataclass
class WebSearchResult:
    query: str
    provider: str
    results: list[SearchHit] = field(default_factory=list)
    summary: str = ""


def _clamp(value: int, top: int) -> int:
    return max(1, min(int(value), top))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


class WebSearchTool(BaseTool):
    """Search the web for the model; constructor options as in the tools guide (``tavily_extra_params`` and the
    ``tavily`` provider are ours)."""

    def __init__(
        self,
        *,
        provider: ProviderName = "duckduckgo",
        api_key: str | None = None,
        engine_id: str | None = None,
        base_url: str | None = None,
        user_agent: str = DEFAULT_USER_AGENT,
        proxy: str | None = None,
        lang: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        results_num: int = DEFAULT_COUNT,
        snippet_len: int = DEFAULT_SNIPPET_CHARS,
        title_len: int = DEFAULT_TITLE_CHARS,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        dedup_urls: bool = True,
        ddg_extra_params: dict[str, Any] | None = None,
        google_extra_params: dict[str, Any] | None = None,
        tavily_extra_params: dict[str, Any] | None = None,
        filters_name: list[str] | None = None,
        filters: list | None = None,
    ) -> None:
        if provider not in PROVIDERS:
            raise ValueError(f"unknown web search provider {provider!r}; choose one of {', '.join(PROVIDERS)}")
        super().__init__(name="websearch", description=DESCRIPTION, filters_name=filters_name, filters=filters)
        self.provider: SearchProvider
        if provider == "google":
            self.provider = GoogleProvider(base_url, google_extra_params, api_key, engine_id, lang)
        elif provider == "tavily":
            self.provider = TavilyProvider(base_url, tavily_extra_params, api_key)
        else:
            self.provider = DuckDuckGoProvider(base_url, ddg_extra_params)
        self.user_agent = user_agent
        self.proxy = proxy
        self.lang = lang
        self.http_client = http_client
        self.results_num = _clamp(results_num, MAX_COUNT)
        self.snippet_len = _clamp(snippet_len, MAX_SNIPPET_CHARS)
        self.title_len = _clamp(title_len, MAX_TITLE_CHARS)
        self.timeout = float(timeout)
        self.dedup_urls = bool(dedup_urls)

    def parameters_schema(self) -> dict[str, Any]:
        domains = {"type": "array", "items": {"type": "string"}}
        return {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to search for (at least 2 characters); for recent "
                          "topics include the year or version."},
                "count": {"type": "integer", "minimum": 1, "maximum": MAX_COUNT,
                          "description": f"How many results (1-{MAX_COUNT}); default {self.results_num}."},
                "allowed_domains": {**domains, "description": "Only results from these domains (and their "
                                    "subdomains). Not with blocked_domains."},
                "blocked_domains": {**domains, "description": "No results from these domains (and their "
                                    "subdomains). Not with allowed_domains."},
                "lang": {"type": "string", "description": "Result language, e.g. 'en' (Google only)."},
            },
            "required": ["query"],
        }

    async def process_request(self, *, tool_context: InvocationContext, llm_request: "LlmRequest") -> None:
        month_year = datetime.date.today().strftime("%B %Y")
        llm_request.append_instructions([CITATION_RULES.format(month_year=month_year)])

    async def _run_async_impl(self, *, tool_context: InvocationContext, args: dict[str, Any]) -> Any:
        query = self._query(args)
        if isinstance(query, str):
            return {"error": query}
        name = self.provider.name
        result = WebSearchResult(query=query.text, provider=name)
        missing = self.provider.not_configured()
        if missing:
            result.summary = missing
            return asdict(result)
        try:
            async with asyncio.timeout(self.timeout):
                data = await self._ask(query)
            answer = self.provider.parse(data, query)
        except (httpx.HTTPError, _StatusError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            return {"error": f"HTTP_ERROR: {_describe(exc)}", "provider": name, "query": query.text}
        except TimeoutError:
            return {"error": f"HTTP_ERROR: the search took longer than {self.timeout:g} s", "provider": name,
                    "query": query.text}
        result.summary = answer.summary
        result.results = self._select(answer.hits, query)
        return asdict(result)

    def _query(self, args: dict[str, Any]) -> Query | str:
        """The validated search, or the error to return."""
        unexpected = sorted(set(args) - {"query", "count", "allowed_domains", "blocked_domains", "lang"})
        if unexpected:
            return f"INVALID_ARGS: unexpected argument(s): {', '.join(unexpected)}"
        text = args.get("query")
        if not isinstance(text, str):
            return "INVALID_ARGS: `query` must be a string"
        if len(text.strip()) < MIN_QUERY_CHARS:
            return f"INVALID_QUERY: query must be at least {MIN_QUERY_CHARS} characters"
        count = args.get("count")
        if count is None:  # left out, or sent as null
            count = self.results_num
        if isinstance(count, bool) or not isinstance(count, int):
            return "INVALID_ARGS: `count` must be an integer"
        lists: dict[str, tuple[str, ...]] = {}
        for key in ("allowed_domains", "blocked_domains"):
            value = args.get(key)
            if value is None:
                lists[key] = ()
            elif not isinstance(value, list) or not all(isinstance(d, str) for d in value):
                return f"INVALID_ARGS: `{key}` must be an array of domain strings"
            elif not (lists.setdefault(key, clean_domains(value))):
                return f"INVALID_ARGS: `{key}` must contain at least one non-empty domain"
        if lists["allowed_domains"] and lists["blocked_domains"]:
            return "INVALID_ARGS: cannot specify both allowed_domains and blocked_domains in the same request"
        lang = args.get("lang")
        if lang is not None and not isinstance(lang, str):
            return "INVALID_ARGS: `lang` must be a string"
        return Query(text.strip(), _clamp(count, MAX_COUNT), lang or None, lists["allowed_domains"], lists["blocked_domains"])

    async def _ask(self, query: Query) -> Any:
        """The provider's JSON answer; raises ``httpx.HTTPError`` or ``ValueError``."""
        if self.http_client is not None:
            return await self._send(self.http_client, query)
        async with httpx.AsyncClient(proxy=self.proxy) as client:
            return await self._send(client, query)

    async def _send(self, client: httpx.AsyncClient, query: Query) -> Any:
        request = self.provider.request(client, query)
        request.headers["User-Agent"] = self.user_agent
        request.extensions["timeout"] = httpx.Timeout(self.timeout).as_dict()
        response = await client.send(request, stream=True)
        try:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    raise ValueError(f"the provider's answer is larger than {MAX_ANSWER_BYTES} bytes")
        finally:
            await response.aclose()
        if not response.is_success:
            raise _StatusError(response.status_code, response.reason_phrase, _api_message(bytes(body)))
        try:
            return json.loads(bytes(body))
        except ValueError:
            raise ValueError(f"the provider's answer is not JSON: {bytes(body[:80])!r}") from None

    def _select(self, hits: list[SearchHit], query: Query) -> list[SearchHit]:
        chosen, seen = [], set()
        for hit in hits:
            url = parse_web_url(hit.url)
            if url is None or not domain_permitted(url_host(url), query.allowed_domains, query.blocked_domains):
                continue
            key = url_key(hit.url)
            if self.dedup_urls and key in seen:
                continue
            seen.add(key)
            chosen.append(SearchHit(_cut(hit.title, self.title_len), hit.url, _cut(hit.snippet, self.snippet_len)))
            if len(chosen) == query.count:
                break
        return chosen


class _StatusError(OrchestratorError):
    """A search provider answered with an error status (its message, when it sent one)."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(f"HTTP {status} {reason}" + (f": {detail}" if detail else ""))


def _api_message(body: bytes) -> str:
    """The message of an API error body (``{"error": {"message": ...}}`` or ``{"detail": ...}``), if any."""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"][:300]
    detail = data.get("detail") if isinstance(data, dict) else None
    return str(detail)[:300] if detail else ""


def _describe(exc: Exception) -> str:
    if isinstance(exc, (_StatusError, ValueError)):
        return str(exc)
    return f"{type(exc).__name__}({exc})"
