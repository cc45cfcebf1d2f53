"""``GET /v1/skills``: paged, searchable, with the total in ``X-Total-Count``."""

from __future__ import annotations

import pytest

from tests.orchestrator.api_helpers import client as api_client
from tests.orchestrator.api_helpers import new_team

ALL = ["data-chart", "markdown-table", "pdf-report", "python-math", "spreadsheet", "user-file-ops", "weather-tools"]


@pytest.fixture
async def client(services):
    async with api_client(services, new_team(services, "team-a")) as c:
        yield c


def _names(answer) -> list[str]:
    return [s["name"] for s in answer.json()]


async def test_the_listing_is_paged_and_says_the_total(client):
    whole = await client.get("/v1/skills")
    assert _names(whole) == ALL and whole.headers["x-total-count"] == str(len(ALL))
    first = await client.get("/v1/skills", params={"limit": 3})
    rest = await client.get("/v1/skills", params={"limit": 3, "offset": 3})
    past = await client.get("/v1/skills", params={"offset": 100})
    assert _names(first) + _names(rest) == ALL[:6]
    assert past.json() == [] and past.headers["x-total-count"] == str(len(ALL))


async def test_the_listing_searches_best_match_first(client):
    found = await client.get("/v1/skills", params={"q": "weather forecast"})
    assert _names(found)[0] == "weather-tools"
    assert found.headers["x-total-count"] == str(len(found.json()))
    none = await client.get("/v1/skills", params={"q": "zzzz qqqq"})
    assert none.json() == [] and none.headers["x-total-count"] == "0"


async def test_a_10000_character_query_is_answered_and_a_longer_one_refused(client):
    query = ("weather " * 1250)[:10_000]
    assert _names(await client.get("/v1/skills", params={"q": query}))[0] == "weather-tools"
    refused = await client.get("/v1/skills", params={"q": query + "x"})
    assert refused.status_code == 422 and "q" in str(refused.json()["errors"])


@pytest.mark.parametrize("params", [{"q": ""}, {"limit": 0}, {"limit": 1001}, {"offset": -1}])
async def test_bad_paging_or_an_empty_query_is_a_clear_422(client, params):
    answer = await client.get("/v1/skills", params=params)
    assert answer.status_code == 422
    assert next(iter(params)) in str(answer.json()["errors"])
