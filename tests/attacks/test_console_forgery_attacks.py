"""Forged requests to the web console at ``/ui``: every state-changing form without the session's own CSRF token
(ten ways of sending a wrong one), forms and logins posted from another site (Sec-Fetch-Site, else Origin) even with
a leaked token or a planted login cookie, and login CSRF by the double-submit cookie alone.

Every test drives the real API app in-process through ``httpx.ASGITransport``, signed in as a browser is (the
``console`` fixture and helpers of ``tests.attacks.console_fixtures``), posts each form the forged way and asserts
it is refused and changed nothing, with a control showing the same form does change things when posted rightly.
Each test's name says what it defends; a test marked ``xfail(strict=True)`` would be an attack that still gets
through (its reason saying what); none is.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from tests.attacks.console_fixtures import (
    HOST,
    LOGIN_COOKIE,
    SESSION_COOKIE,
    SKILL,
    Browser,
    Console,
    console,  # noqa: F401 - the fixture
    csrf_of,
    current_version,
    install_library,
    plant_run,
    runs_of,
)
from tests.orchestrator.test_api_teams import skill_md, tar_gz
from worker.run_store import RunStatus

# ----------------------------------------------------------------------------------------------------------------
# 1. Forged requests: every state-changing form needs the session's own CSRF token


@dataclass
class Action:
    """A console form that changes something: how to post it, and whether it changed anything."""

    path: Callable[[Console, dict], str]
    fields: dict[str, str]
    changed: Callable[[Console, dict, Browser], Awaitable[bool]]
    prepare: Callable[[Console], dict] = lambda console: {}
    files: dict | None = None


def _two_versions(console: Console) -> dict:
    for n in (1, 2):
        install_library(console, "team-a", "lib", {f"s{n}/SKILL.md": skill_md(f"s{n}", "x\n")})
    return {}


async def _signed_out(console: Console, state: dict, browser: Browser) -> bool:
    return (await browser.get("/ui/skills")).status_code != 200


async def _now(value: bool) -> bool:
    return value


ACTIONS = {
    "logout": Action(lambda c, s: "/ui/logout", {}, _signed_out),
    "run": Action(lambda c, s: f"/ui/skills/{SKILL}/run", {"command": "echo forged"},
                  lambda c, s, b: _now(bool(runs_of(c)))),
    "cancel": Action(lambda c, s: f"/ui/runs/{s['run']}/cancel", {},
                     lambda c, s, b: _now(c.services.dispatcher.store.get(s["run"]).status != RunStatus.QUEUED),
                     prepare=lambda c: {"run": plant_run(c, "team-a", RunStatus.QUEUED)}),
    "upload": Action(lambda c, s: "/ui/libraries/upload", {"name": "forged"},
                     lambda c, s, b: _now(current_version(c, "team-a", "forged") is not None),
                     files={"archive": ("forged.tar.gz", tar_gz({"forged/SKILL.md": skill_md("forged", "x\n")}))}),
    "register": Action(lambda c, s: "/ui/libraries/register",
                       {"name": "forged", "url": "http://127.0.0.1:9/forged.tar.gz"},
                       lambda c, s, b: _now(current_version(c, "team-a", "forged") is not None)),
    "make-current": Action(lambda c, s: "/ui/libraries/lib/current", {"version": "1"},
                           lambda c, s, b: _now(current_version(c, "team-a", "lib") != 2),
                           prepare=_two_versions),
}


async def _token(console: Console, variant: str, browser: Browser) -> tuple[dict, dict]:
    """The extra form fields and request options that send the CSRF token ``variant`` way."""
    if variant == "missing":
        return {}, {}
    if variant == "empty":
        return {"csrf": ""}, {}
    if variant == "wrong":
        return {"csrf": secrets.token_urlsafe(32)}, {}
    if variant == "truncated":
        return {"csrf": browser.csrf[:-1]}, {}
    if variant == "other-session-same-team":
        return {"csrf": (await console.browser("team-a")).csrf}, {}
    if variant == "other-team-session":
        return {"csrf": (await console.browser("team-b")).csrf}, {}
    if variant == "login-cookie-value":
        login = await console.client().get("/ui/login")
        return {"csrf": login.cookies[LOGIN_COOKIE]}, {}
    if variant == "in-query-string":
        return {}, {"params": {"csrf": browser.csrf}}
    if variant == "in-a-header":
        return {}, {"headers": {"X-CSRF-Token": browser.csrf, "X-CSRFToken": browser.csrf}}
    if variant == "as-a-file-part":
        return {}, {"files": {"csrf": ("csrf", browser.csrf.encode())}}
    raise AssertionError(variant)


TOKEN_VARIANTS = ["missing", "empty", "wrong", "truncated", "other-session-same-team", "other-team-session",
                  "login-cookie-value", "in-query-string", "in-a-header", "as-a-file-part"]


@pytest.mark.parametrize("variant", TOKEN_VARIANTS)
@pytest.mark.parametrize("action", ACTIONS.keys())
async def test_state_changing_forms_refuse_a_missing_or_wrong_csrf_token_and_change_nothing(console, action, variant):
    todo = ACTIONS[action]
    state = todo.prepare(console)
    browser = await console.browser()
    fields, options = await _token(console, variant, browser)
    if todo.files:
        options["files"] = {**todo.files, **options.get("files", {})}
    answer = await browser.post(todo.path(console, state), data={**todo.fields, **fields}, **options)
    assert answer.status_code == 403, (answer.status_code, answer.text[:2000])
    assert "CSRF" in answer.text
    assert not await todo.changed(console, state, browser)


@pytest.mark.parametrize("action", ["logout", "cancel", "make-current", "upload"])
async def test_the_same_forms_with_the_session_s_token_do_change_things(console, action):
    """The control for the refusals above: with the right token each action does happen."""
    todo = ACTIONS[action]
    state = todo.prepare(console)
    browser = await console.browser()
    answer = await browser.post(todo.path(console, state), data={"csrf": browser.csrf, **todo.fields},
                                files=todo.files)
    assert answer.status_code in (200, 303), answer.text[:2000]
    assert await todo.changed(console, state, browser)


async def test_a_login_without_its_double_submit_cookie_is_refused_whatever_key_it_carries(console):
    """Login CSRF, the token layer alone (no Origin or Sec-Fetch-Site, as from a client that sends neither): the form
    must carry the value of the SameSite=Strict, HTTP-only login cookie, which another site can neither send nor
    read; the key is not even looked at."""
    attacker = console.client()
    for fields, cookie in [({"key": console.keys["team-b"], "csrf": "guessed"}, None),
                           ({"key": console.keys["team-b"]}, None),
                           ({"key": console.keys["team-b"], "csrf": ""}, ""),
                           ({"key": console.keys["team-b"], "csrf": "a" * 43}, "b" * 43),
                           ({"key": console.keys["team-b"], "csrf": "a" * 43 + "x"}, "a" * 43),
                           ({"key": console.keys["team-b"]}, "b" * 43)]:
        attacker.cookies.clear()
        if cookie is not None:
            attacker.cookies.set(LOGIN_COOKIE, cookie, domain=HOST, path="/ui")
        answer = await attacker.post("/ui/login", data=fields)
        assert answer.status_code == 403, (fields, cookie, answer.status_code)
        assert SESSION_COOKIE not in answer.headers.get("set-cookie", "")
    assert not console.sessions._sessions


CROSS_SITE = {
    "sec-fetch-site cross-site": {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
    "sec-fetch-site same-site": {"Sec-Fetch-Site": "same-site", "Origin": f"https://sibling.{HOST}"},
    "sec-fetch-site wins over origin": {"Sec-Fetch-Site": "cross-site", "Origin": f"http://{HOST}"},
    "origin only, another site": {"Origin": "https://evil.example"},
    "origin only, a sibling host": {"Origin": f"http://sibling.{HOST}"},
    "origin only, another port": {"Origin": f"http://{HOST}:8443"},
    "origin only, null (sandboxed frame)": {"Origin": "null"},
}


@pytest.mark.parametrize("headers", CROSS_SITE.values(), ids=CROSS_SITE.keys())
async def test_a_login_posted_from_another_site_is_refused_even_with_a_planted_login_cookie(console, headers):
    """Login CSRF where the attacker can plant a cookie on the console's host (a sibling subdomain, an http://
    answer): the double submit is beaten, the browser's Sec-Fetch-Site / Origin still gives the post away."""
    attacker = console.client()
    attacker.cookies.set(LOGIN_COOKIE, "planted-by-a-sibling-host", domain=HOST, path="/ui")
    answer = await attacker.post("/ui/login", data={"key": console.keys["team-b"],
                                                     "csrf": "planted-by-a-sibling-host"}, headers=headers)
    assert answer.status_code == 403, answer.status_code
    assert SESSION_COOKIE not in answer.headers.get("set-cookie", "") and not console.sessions._sessions


@pytest.mark.parametrize("headers", CROSS_SITE.values(), ids=CROSS_SITE.keys())
async def test_forms_posted_from_another_site_are_refused_even_with_the_session_s_token(console, headers):
    """A token leaked to another site (or a forged page that learnt it) is still refused from there."""
    queued = plant_run(console, "team-a", RunStatus.QUEUED)
    browser = await console.browser()
    for path, fields in ((f"/ui/runs/{queued}/cancel", {}), (f"/ui/skills/{SKILL}/run", {"command": "true"}),
                         ("/ui/logout", {})):
        answer = await browser.form(path, fields, headers=headers)
        assert answer.status_code == 403, (path, answer.status_code)
    assert console.services.dispatcher.store.get(queued).status == RunStatus.QUEUED
    assert [run.id for run in runs_of(console)] == [queued]  # and no run was submitted
    assert (await browser.get("/ui/skills")).status_code == 200  # still signed in


SAME_SITE = {
    "sec-fetch-site same-origin": {"Sec-Fetch-Site": "same-origin", "Origin": f"http://{HOST}"},
    "sec-fetch-site none (typed in)": {"Sec-Fetch-Site": "none"},
    "origin only, this host": {"Origin": f"http://{HOST}"},
    "neither (not a browser)": {},
}


@pytest.mark.parametrize("headers", SAME_SITE.values(), ids=SAME_SITE.keys())
async def test_the_console_s_own_forms_still_work_from_its_own_pages(console, headers):
    """The control for the cross-site refusals: the same posts from the console's own origin go through."""
    queued = plant_run(console, "team-a", RunStatus.QUEUED)
    browser = Browser(console.client())
    login = await browser.get("/ui/login")
    signed = await browser.post("/ui/login", data={"key": console.keys["team-a"], "csrf": csrf_of(login.text)},
                                headers=headers)
    assert signed.status_code == 303, signed.text
    browser.csrf = csrf_of((await browser.get("/ui/skills")).text)
    cancel = await browser.form(f"/ui/runs/{queued}/cancel", headers=headers)
    assert cancel.status_code == 303 and console.services.dispatcher.store.get(queued).status != RunStatus.QUEUED


async def test_a_login_posted_from_the_same_host_over_plain_http_is_refused_on_an_https_console(console):
    attacker = console.client(https=True)
    attacker.cookies.set(LOGIN_COOKIE, "planted-over-http", domain=HOST, path="/ui")
    answer = await attacker.post("/ui/login", data={"key": console.keys["team-b"], "csrf": "planted-over-http"},
                                 headers={"Origin": f"http://{HOST}"})
    assert answer.status_code == 403 and not console.sessions._sessions
