"""WebSearchTool against local servers that answer in each provider's real format (no internet here)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from orchestrator.context import InvocationContext
from orchestrator.models.base import LlmRequest
from orchestrator.tools import SearchHit, WebSearchResult, WebSearchTool
from tests.web_server import WebServer

JSON = {"Content-Type": "application/json"}
DDG_ANSWER = {
    "Heading": "Python (programming language)",
    "AbstractText": "Python is a high-level, general-purpose programming language.",
    "AbstractSource": "Wikipedia",
    "AbstractURL": "https://en.wikipedia.org/wiki/Python_(programming_language)",
    "Answer": "",
    "Definition": "",
    "Results": [{"FirstURL": "https://www.python.org/", "Text": "Official site - Python.org", "Result": "<a>..</a>"}],
    "RelatedTopics": [
        {"FirstURL": "https://duckduckgo.com/Guido_van_Rossum", "Text": "Guido van Rossum - Dutch programmer.", "Icon": {}},
        {"Name": "See also", "Topics": [
            {"FirstURL": "https://docs.python.org/3/", "Text": "Python docs - The documentation.", "Icon": {}},
            {"FirstURL": "https://python.org", "Text": "Python.org again - duplicate of the official site.", "Icon": {}},
        ]},
    ],
    "Type": "A",
}
GOOGLE_ANSWER = {
    "kind": "customsearch#search",
    "searchInformation": {"totalResults": "2"},
    "spelling": {"correctedQuery": "python 3.13 release highlights"},
    "items": [
        {"kind": "customsearch#result", "title": "What's New In Python 3.13", "link": "https://docs.python.org/3/whatsnew/3.13.html",
         "displayLink": "docs.python.org", "snippet": "This article explains the new features in Python 3.13 ..."},
        {"kind": "customsearch#result", "title": "Python 3.13.0 Release Notes", "link": "https://www.python.org/downloads/release/python-3130/",
         "displayLink": "www.python.org", "snippet": "Python 3.13 is the newest major release ..."},
        {"kind": "customsearch#result", "title": "A blog", "link": "https://blog.example.com/py313", "snippet": "..."},
    ],
}
TAVILY_ANSWER = {
    "query": "python 3.13", "answer": "Python 3.13 adds a free-threaded build.", "images": [], "response_time": 0.9,
    "results": [
        {"title": "What's New In Python 3.13", "url": "https://docs.python.org/3/whatsnew/3.13.html",
         "content": "Summary of changes.", "score": 0.98, "raw_content": None},
        {"title": "Release", "url": "https://www.python.org/downloads/release/python-3130/", "content": "Download.", "score": 0.9},
    ],
}


@pytest.fixture
def web():
    server = WebServer().start()
    server.routes["/ddg/"] = (200, {"Content-Type": "application/x-javascript"}, json.dumps(DDG_ANSWER).encode())
    server.routes["/customsearch/v1"] = (200, JSON, json.dumps(GOOGLE_ANSWER).encode())
    server.routes["/search"] = (200, JSON, json.dumps(TAVILY_ANSWER).encode())
    yield server
    server.stop()


def ddg(web, **options) -> WebSearchTool:
    return WebSearchTool(base_url=web.url("/ddg/"), **options)


def google(web, **options) -> WebSearchTool:
    return WebSearchTool(provider="google", api_key="k-123", engine_id="cx-9", base_url=web.url("/customsearch/v1"), **options)


async def search(tool: WebSearchTool, **args) -> dict:
    return await tool.run_async(tool_context=InvocationContext.__new__(InvocationContext), args=args)


async def test_duckduckgo_results_summary_and_dedup(web):
    result = await search(ddg(web), query="Python (programming language)", count=10)
    assert set(result) == {"query", "provider", "results", "summary"} and result["provider"] == "duckduckgo"
    urls = [hit["url"] for hit in result["results"]]
    assert urls == ["https://en.wikipedia.org/wiki/Python_(programming_language)", "https://www.python.org/",
                    "https://duckduckgo.com/Guido_van_Rossum", "https://docs.python.org/3/"]  # python.org once
    assert result["results"][1] == {"title": "Official site", "url": "https://www.python.org/", "snippet": "Official site - Python.org"}
    assert result["summary"].startswith("Python is a high-level") and "(source: Wikipedia)" in result["summary"]
    asked = web.requests[0]
    assert asked.query["q"] == ["Python (programming language)"] and asked.query["format"] == ["json"]
    assert asked.headers["User-Agent"] == "trpc-agent-python-websearch/1.0"


async def test_without_dedup_the_raw_hits_are_kept(web):
    result = await search(ddg(web, dedup_urls=False, results_num=10), query="python")
    assert [h["url"] for h in result["results"]].count("https://python.org") == 1 and len(result["results"]) == 5


async def test_count_results_num_and_lengths_are_clamped(web):
    tool = ddg(web, results_num=3, snippet_len=10, title_len=5)
    result = await search(tool, query="python")
    assert len(result["results"]) == 3
    assert all(len(h["snippet"]) <= 10 and len(h["title"]) <= 5 for h in result["results"])
    assert len((await search(tool, query="python", count=1))["results"]) == 1
    nulls = await search(tool, query="python", count=None, lang=None, allowed_domains=None, blocked_domains=None)
    assert len(nulls["results"]) == 3
    assert len((await search(tool, query="python", count=99))["results"]) == 4  # clamped to 10; 4 unique hits
    assert WebSearchTool(results_num=0, snippet_len=10**6, title_len=-1).results_num == 1


async def test_duckduckgo_with_no_hit_cites_its_search_page(web):
    web.routes["/ddg/"] = (200, JSON, json.dumps({"Heading": "", "AbstractURL": "", "RelatedTopics": []}).encode())
    result = await search(ddg(web), query="zzqx nothing")
    assert result["results"] == [{"title": "DuckDuckGo search: zzqx nothing", "url": "https://duckduckgo.com/?q=zzqx+nothing", "snippet": ""}]


async def test_domain_filters_are_subdomain_aware(web):
    allowed = await search(ddg(web), query="python", allowed_domains=["www.python.org"], count=10)
    assert [h["url"] for h in allowed["results"]] == ["https://www.python.org/", "https://docs.python.org/3/"]
    blocked = await search(ddg(web), query="python", blocked_domains=["python.org", "wikipedia.org"], count=10)
    assert [h["url"] for h in blocked["results"]] == ["https://duckduckgo.com/Guido_van_Rossum"]


async def test_google_results_params_and_spelling(web):
    result = await search(google(web, lang="en", google_extra_params={"safe": "active"}), query="pyton 3.13 highlights")
    assert result["provider"] == "google" and result["summary"] == "Showing results for: python 3.13 release highlights"
    assert result["results"][0] == {"title": "What's New In Python 3.13", "url": "https://docs.python.org/3/whatsnew/3.13.html",
                                    "snippet": "This article explains the new features in Python 3.13 ..."}
    asked = web.requests[0].query
    assert asked["key"] == ["k-123"] and asked["cx"] == ["cx-9"] and asked["num"] == ["5"]
    assert asked["hl"] == ["en"] and asked["safe"] == ["active"] and "siteSearch" not in asked


async def test_google_one_domain_goes_to_the_server_and_more_are_filtered_here(web):
    tool = google(web)
    one = await search(tool, query="python", allowed_domains=["python.org"], lang="de")
    assert web.requests[-1].query["siteSearch"] == ["python.org"] and web.requests[-1].query["siteSearchFilter"] == ["i"]
    assert web.requests[-1].query["hl"] == ["de"]
    assert [h["url"] for h in one["results"]] == ["https://docs.python.org/3/whatsnew/3.13.html",
                                                  "https://www.python.org/downloads/release/python-3130/"]
    several = await search(tool, query="python", blocked_domains=["docs.python.org", "example.com"])
    assert "siteSearch" not in web.requests[-1].query
    assert [h["url"] for h in several["results"]] == ["https://www.python.org/downloads/release/python-3130/"]


async def test_google_not_configured_says_so_and_asks_nothing(web, monkeypatch):
    monkeypatch.delenv("GOOGLE_CSE_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_CSE_ENGINE_ID", raising=False)
    result = await search(WebSearchTool(provider="google", base_url=web.url("/customsearch/v1")), query="python")
    assert result["results"] == [] and result["query"] == "python" and result["provider"] == "google"
    assert result["summary"].startswith("Google provider is not configured: set api_key + engine_id")
    assert web.requests == []


async def test_google_credentials_come_from_the_environment(web, monkeypatch):
    monkeypatch.setenv("GOOGLE_CSE_API_KEY", "env-key")
    monkeypatch.setenv("GOOGLE_CSE_ENGINE_ID", "env-cx")
    await search(WebSearchTool(provider="google", base_url=web.url("/customsearch/v1")), query="python")
    assert web.requests[0].query["key"] == ["env-key"] and web.requests[0].query["cx"] == ["env-cx"]


async def test_tavily_results_answer_and_request(web, monkeypatch):
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    tool = WebSearchTool(provider="tavily", api_key="tvly-abc", base_url=web.url("/search"), results_num=4)
    result = await search(tool, query="python 3.13", allowed_domains=["python.org"])
    assert result["provider"] == "tavily" and result["summary"] == "Python 3.13 adds a free-threaded build."
    assert [h["snippet"] for h in result["results"]] == ["Summary of changes.", "Download."]
    asked = web.requests[0]
    assert asked.method == "POST" and asked.headers["Authorization"] == "Bearer tvly-abc"
    body = json.loads(asked.body)
    assert body["query"] == "python 3.13" and body["max_results"] == 4 and body["include_domains"] == ["python.org"]
    missing = await search(WebSearchTool(provider="tavily", base_url=web.url("/search")), query="python")
    assert missing["summary"].startswith("Tavily provider is not configured") and len(web.requests) == 1


@pytest.mark.parametrize("args, error", [
    ({"query": "p"}, "INVALID_QUERY: query must be at least 2 characters"),
    ({"query": "   "}, "INVALID_QUERY: query must be at least 2 characters"),
    ({"query": 3}, "INVALID_ARGS: `query` must be a string"),
    ({}, "INVALID_ARGS: `query` must be a string"),
    ({"query": "python", "allowed_domains": ["a.com"], "blocked_domains": ["b.com"]},
     "INVALID_ARGS: cannot specify both allowed_domains and blocked_domains in the same request"),
    ({"query": "python", "allowed_domains": "a.com"}, "INVALID_ARGS: `allowed_domains` must be an array of domain strings"),
    ({"query": "python", "blocked_domains": [" "]}, "INVALID_ARGS: `blocked_domains` must contain at least one non-empty domain"),
    ({"query": "python", "count": "3"}, "INVALID_ARGS: `count` must be an integer"),
    ({"query": "python", "lang": 5}, "INVALID_ARGS: `lang` must be a string"),
    ({"query": "python", "site": "x"}, "INVALID_ARGS: unexpected argument(s): site"),
])
async def test_bad_arguments_are_errors_and_nothing_is_asked(web, args, error):
    assert await search(ddg(web), **args) == {"error": error}
    assert web.requests == []


@pytest.mark.parametrize("route, detail", [
    ((200, JSON, b"{not json"), "HTTP_ERROR: the provider's answer is not JSON"),
    ((200, JSON, b"[1, 2]"), "HTTP_ERROR: the answer is not a JSON object"),
    ((403, JSON, json.dumps({"error": {"code": 403, "message": "API key not valid."}}).encode()),
     "HTTP_ERROR: HTTP 403 Forbidden: API key not valid."),
    ((500, {"Content-Type": "text/html"}, b"<h1>oops</h1>"), "HTTP_ERROR: HTTP 500 Internal Server Error"),
])
async def test_provider_failures_are_http_errors(web, route, detail):
    web.routes["/customsearch/v1"] = route
    result = await search(google(web), query="python")
    assert set(result) == {"error", "provider", "query"} and result["provider"] == "google" and result["query"] == "python"
    assert result["error"].startswith(detail)


async def test_an_unreachable_provider_is_http_error(web):
    port = web.port
    web.stop()
    result = await search(WebSearchTool(base_url=f"http://127.0.0.1:{port}/", timeout=2), query="python")
    assert result["error"].startswith("HTTP_ERROR: ConnectError(") and result["provider"] == "duckduckgo"
    web.start()


async def test_a_provider_that_answers_too_slowly_is_http_error(web):
    def slow(handler):
        time.sleep(1)

    web.routes["/ddg/"] = slow
    result = await search(ddg(web, timeout=0.3), query="python")
    assert result["error"].startswith(("HTTP_ERROR: ReadTimeout(", "HTTP_ERROR: the search took longer than 0.3 s"))


async def test_a_shared_client_is_used_left_open_and_given_the_tools_user_agent(web):
    async with httpx.AsyncClient(headers={"User-Agent": "shared"}) as client:
        result = await search(ddg(web, http_client=client, user_agent="mine/2"), query="python")
        assert result["results"] and not client.is_closed
    assert web.requests[0].headers["User-Agent"] == "mine/2"


async def test_the_citation_rules_are_added_to_each_request():
    request = LlmRequest(system_instruction="Be brief.")
    await WebSearchTool().process_request(tool_context=InvocationContext.__new__(InvocationContext), llm_request=request)
    assert request.system_instruction.startswith("Be brief.\n\nWhen you use results of the websearch tool:")
    assert "Sources:" in request.system_instruction and "Never invent a URL" in request.system_instruction


def test_an_unknown_provider_is_refused():
    with pytest.raises(ValueError, match="unknown web search provider 'bing'"):
        WebSearchTool(provider="bing")


def test_result_types():
    assert WebSearchResult(query="q", provider="google").results == [] and SearchHit().url == ""
