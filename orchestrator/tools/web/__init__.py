"""The web tool family: ``WebFetchTool`` (one GET of a public URL, each hop's address vetted) and ``WebSearchTool``
(DuckDuckGo, Google Custom Search or Tavily), with the URL helpers and the cache they share. Exports are imported on
first use (``worker.lazy``): they load httpx and an HTML parser."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "orchestrator.tools.web.fetch": ["FetchResult", "WebFetchTool"],
    "orchestrator.tools.web.search": ["SearchHit", "WebSearchResult", "WebSearchTool"],
})

if TYPE_CHECKING:
    from orchestrator.tools.web.fetch import FetchResult, WebFetchTool
    from orchestrator.tools.web.search import SearchHit, WebSearchResult, WebSearchTool
