"""The search back ends of ``WebSearchTool``, each through its documented HTTP API.

A provider says what request one search is (``request``) and reads the JSON answer into hits and a summary
(``parse``); ``WebSearchTool`` sends the request, maps HTTP and JSON failures, filters, de-duplicates and cuts.

- ``duckduckgo`` — the Instant Answer API (``GET https://api.duckduckgo.com/?q=…&format=json``), no key: the
  abstract, results and related topics (nested topic groups flattened); the summary joins answer, abstract and
  definition. With no hit, DuckDuckGo's search page for the query is the one source.
- ``google`` — Custom Search JSON API (``GET https://www.googleapis.com/customsearch/v1?key=…&cx=…&q=…``): ``items``;
  one allowed or blocked domain goes to the server as ``siteSearch``; a spelling correction lands in the summary.
- ``tavily`` — Tavily Search (``POST https://api.tavily.com/search``, ``Authorization: Bearer <key>``): ``results``
  with ``include_domains``/``exclude_domains``; Tavily's ``answer`` is the summary. (Ours: the guide shows Tavily
  only through LangChain.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote_plus

import httpx

GOOGLE_MAX_NUM = 10  # the CSE API answers 400 above this


@dataclass(frozen=True)
class SearchHit:
    """One result: ``title``, ``url``, ``snippet``."""

    title: str = ""
    url: str = ""
    snippet: str = ""


@dataclass
class Query:
    """One search as the model asked for it (validated)."""

    text: str
    count: int
    lang: str | None = None
    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()


@dataclass
class Answer:
    hits: list[SearchHit] = field(default_factory=list)
    summary: str = ""


class SearchProvider:
    name = ""
    default_base_url = ""

    def __init__(self, base_url: str | None, extra_params: dict[str, Any] | None) -> None:
        self.base_url = base_url or self.default_base_url
        self.extra_params = dict(extra_params or {})

    def not_configured(self) -> str:
        """Why searches cannot be made (a missing credential), or ``""``."""
        return ""

    def request(self, client: httpx.AsyncClient, query: Query) -> httpx.Request:
        raise NotImplementedError

    def parse(self, data: Any, query: Query) -> Answer:
        raise NotImplementedError


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


class DuckDuckGoProvider(SearchProvider):
    name = "duckduckgo"
    default_base_url = "https://api.duckduckgo.com/"

    def request(self, client: httpx.AsyncClient, query: Query) -> httpx.Request:
        params = {"q": query.text, "format": "json", "no_html": "1", "skip_disambig": "1", **self.extra_params}
        return client.build_request("GET", self.base_url, params=params)

    def parse(self, data: Any, query: Query) -> Answer:
        if not isinstance(data, dict):
            raise ValueError("the answer is not a JSON object")
        hits: list[SearchHit] = []
        if _text(data.get("AbstractURL")):
            hits.append(SearchHit(_text(data.get("Heading")) or _text(data.get("AbstractSource")),
                                  _text(data.get("AbstractURL")), _text(data.get("AbstractText"))))
        topics = _dicts(data.get("Results")) + _dicts(data.get("RelatedTopics"))
        for topic in topics:
            for item in [topic, *_dicts(topic.get("Topics"))]:  # a group of topics carries them under "Topics"
                url, text = _text(item.get("FirstURL")), _text(item.get("Text"))
                if url:
                    hits.append(SearchHit(text.split(" - ", 1)[0], url, text))
        summary = "\n".join(s for s in (
            _text(data.get("Answer")),
            _text(data.get("AbstractText")) + (f" (source: {_text(data.get('AbstractSource'))})"
                                               if _text(data.get("AbstractText")) and _text(data.get("AbstractSource")) else ""),
            _text(data.get("Definition")),
        ) if s)
        if not hits:
            hits.append(SearchHit(f"DuckDuckGo search: {query.text}", f"https://duckduckgo.com/?q={quote_plus(query.text)}", ""))
        return Answer(hits, summary)


class GoogleProvider(SearchProvider):
    name = "google"
    default_base_url = "https://www.googleapis.com/customsearch/v1"

    def __init__(self, base_url, extra_params, api_key: str | None, engine_id: str | None, lang: str | None) -> None:
        super().__init__(base_url, extra_params)
        self.api_key = api_key or os.environ.get("GOOGLE_CSE_API_KEY", "")
        self.engine_id = engine_id or os.environ.get("GOOGLE_CSE_ENGINE_ID", "")
        self.lang = lang

    def not_configured(self) -> str:
        if self.api_key and self.engine_id:
            return ""
        return ("Google provider is not configured: set api_key + engine_id (or GOOGLE_CSE_API_KEY + "
                "GOOGLE_CSE_ENGINE_ID)")

    def request(self, client: httpx.AsyncClient, query: Query) -> httpx.Request:
        params: dict[str, Any] = {**self.extra_params, "key": self.api_key, "cx": self.engine_id, "q": query.text,
                                  "num": min(query.count, GOOGLE_MAX_NUM)}
        lang = query.lang or self.lang
        if lang:
            params["hl"] = lang
        for domains, mode in ((query.allowed_domains, "i"), (query.blocked_domains, "e")):
            if len(domains) == 1:  # the server filters one domain; more are filtered here
                params.update(siteSearch=domains[0], siteSearchFilter=mode)
        return client.build_request("GET", self.base_url, params=params)

    def parse(self, data: Any, query: Query) -> Answer:
        if not isinstance(data, dict):
            raise ValueError("the answer is not a JSON object")
        hits = [SearchHit(_text(i.get("title")), _text(i.get("link")), _text(i.get("snippet")))
                for i in _dicts(data.get("items")) if _text(i.get("link"))]
        spelling = data.get("spelling")
        corrected = _text(spelling.get("correctedQuery")) if isinstance(spelling, dict) else ""
        return Answer(hits, f"Showing results for: {corrected}" if corrected else "")


class TavilyProvider(SearchProvider):
    name = "tavily"
    default_base_url = "https://api.tavily.com/search"

    def __init__(self, base_url, extra_params, api_key: str | None) -> None:
        super().__init__(base_url, extra_params)
        self.api_key = api_key or os.environ.get("TAVILY_API_KEY", "")

    def not_configured(self) -> str:
        return "" if self.api_key else "Tavily provider is not configured: set api_key (or TAVILY_API_KEY)"

    def request(self, client: httpx.AsyncClient, query: Query) -> httpx.Request:
        body: dict[str, Any] = {"search_depth": "basic", "include_answer": True, **self.extra_params,
                                "query": query.text, "max_results": query.count}
        if query.allowed_domains:
            body["include_domains"] = list(query.allowed_domains)
        if query.blocked_domains:
            body["exclude_domains"] = list(query.blocked_domains)
        return client.build_request("POST", self.base_url, json=body, headers={"Authorization": f"Bearer {self.api_key}"})

    def parse(self, data: Any, query: Query) -> Answer:
        if not isinstance(data, dict):
            raise ValueError("the answer is not a JSON object")
        hits = [SearchHit(_text(r.get("title")), _text(r.get("url")), _text(r.get("content")))
                for r in _dicts(data.get("results")) if _text(r.get("url"))]
        return Answer(hits, _text(data.get("answer")))


PROVIDERS = ("duckduckgo", "google", "tavily")
