"""A stand-in for ``langchain_tavily`` (no internet here): a ``TavilySearch`` built on ``langchain_core``'s
``BaseTool``, answering from a fixed corpus in Tavily's result shape, so the guide's LangChain example runs through
the real ``langchain_core`` tool machinery (``ainvoke``, argument parsing, callbacks)."""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool

CORPUS = [
    {"title": "tRPC-Agent overview", "url": "https://example.org/trpc-agent", "content": "An agent framework."},
    {"title": "Skill runtimes", "url": "https://example.org/runtimes", "content": "Local, container, cube."},
    {"title": "Tool guide", "url": "https://example.org/tools", "content": "FunctionTool, MCP, LangChain."},
]

QUERIES: list[str] = []
"""Every query the stand-in answered, so a test can see the call went through it."""


class TavilySearch(BaseTool):
    """Tavily's search tool: ``invoke``/``ainvoke`` with a query string return ``{"query", "results"}``."""

    name: str = "tavily_search"
    description: str = "Search the web with Tavily."
    max_results: int = 5

    def _run(self, query: str, **_: Any) -> dict[str, Any]:
        if not query.strip():
            raise ValueError("query must not be empty")
        QUERIES.append(query)
        return {"query": query, "results": CORPUS[: self.max_results]}
