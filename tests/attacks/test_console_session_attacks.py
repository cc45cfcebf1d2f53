"""Attacks on the web console's sessions and boundaries at ``/ui``: fixed, stolen, stale and surplus sessions
(fixation, cookie flags, logout, key revocation, expiry, the per-team bound, what the store keeps, in memory and in
Redis), the console cookie on the JSON API, one team reaching another's runs, files, artifacts, events, libraries and
skills, redirects off the site, and paths out of their folders.

Every test drives the real API app in-process through ``httpx.ASGITransport`` (or straight through ASGI where a
path must reach it exactly as sent), signed in as a browser is, against runs planted in the run store (the
``console`` and ``any_store`` fixtures and helpers of ``tests.attacks.console_fixtures``). Each test's name says
what it defends; a test marked ``xfail(strict=True)`` would be an attack that still gets through (its reason saying
what); none is.
"""

from __future__ import annotations

import hashlib
import time
import urllib.parse

import httpx
import pytest

from orchestrator.console.sessions import BaseConsoleSessions, MemoryConsoleSessions, RedisConsoleSessions
from tests.attacks.console_fixtures import (
    HOST,
    LOGIN_COOKIE,
    SESSION_COOKIE,
    SKILL,
    Browser,
    Console,
    any_store,  # noqa: F401 - the fixture
    asgi,
    console,  # noqa: F401 - the fixture
    cookie_client,
    csrf_of,
    current_version,
    install_library,
    plant_run,
    runs_of,
    text_file,
)
from tests.orchestrator.test_api_teams import skill_md
from worker.run_store import RunStatus

EIGHT_HOURS = 8 * 3600
PER_TEAM = 50


# ----------------------------------------------------------------------------------------------------------------
# 1. Sessions: fixation, cookie flags, logout, revocation, expiry, the per-team bound, what the store keeps


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def stored(sessions: BaseConsoleSessions, token: str) -> object | None:
    """The session the store holds under ``token``'s digest, whether expired or not."""
    return await sessions._get(digest(token))


async def test_a_session_cookie_planted_before_sign_in_does_not_survive_it(any_store):
    console = any_store
    browser = Browser(console.client())
    planted = "attacker-chosen-session-token-" + "x" * 20
    browser.http.cookies.set(SESSION_COOKIE, planted, domain=HOST, path="/ui")
    assert (await browser.get("/ui/skills")).status_code == 303  # it is not a session
    await browser.sign_in(console.keys["team-a"])
    assert browser.token and browser.token != planted
    assert await console.sessions.get(planted) is None
    async with cookie_client(console, planted) as replay:
        assert (await replay.get("/ui/skills")).headers.get("location") == "/ui/login"
    second = await console.browser("team-a")
    assert second.token != browser.token and second.csrf != browser.csrf  # a fresh token and CSRF each time


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
async def test_session_and_login_cookies_are_http_only_strict_host_only_and_secure_over_https(console, https):
    browser = Browser(console.client(https))
    login = await browser.get("/ui/login")
    signed = await browser.post("/ui/login", data={"key": console.keys["team-a"], "csrf": csrf_of(login.text)})
    for answer, name in ((login, LOGIN_COOKIE), (signed, SESSION_COOKIE)):
        cookie = next(c for c in answer.headers.get_list("set-cookie") if c.startswith(f"{name}="))
        attributes = {a.strip().split("=")[0].lower(): a.strip().partition("=")[2] for a in cookie.split(";")[1:]}
        assert "httponly" in attributes and attributes["samesite"].lower() == "strict", cookie
        assert attributes["path"] == "/ui" and "domain" not in attributes, cookie
        assert ("secure" in attributes) == https, cookie
    session = next(c for c in signed.headers.get_list("set-cookie") if c.startswith(f"{SESSION_COOKIE}="))
    assert f"Max-Age={EIGHT_HOURS}" in session
    assert len(session.split(";")[0].split("=", 1)[1]) >= 32  # a random token of 32 bytes or more


async def test_signing_out_forgets_the_session_on_the_server_not_only_in_the_browser(any_store):
    console = any_store
    browser = await console.browser()
    token, csrf = browser.token, browser.csrf
    out = await browser.form("/ui/logout")
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    assert await stored(console.sessions, token) is None
    async with cookie_client(console, token) as replay:  # the cookie, kept by whoever copied it
        assert (await replay.get("/ui/skills")).headers.get("location") == "/ui/login"
        assert (await replay.post("/ui/logout", data={"csrf": csrf})).headers.get("location") == "/ui/login"
        run = await replay.post(f"/ui/skills/{SKILL}/run", data={"csrf": csrf, "command": "true"})
        assert run.status_code == 303 and run.headers["location"] == "/ui/login"
    assert runs_of(console) == []


async def test_revoking_the_key_ends_its_console_sessions_at_once(any_store):
    console = any_store
    browser = await console.browser()
    other_team = await console.browser("team-b")
    console.services.teams.revoke_key(console.key_ids["team-a"])
    for path in ("/ui/skills", "/ui/runs", "/ui/libraries", "/ui/operator"):
        assert (await browser.get(path)).headers.get("location") == "/ui/login", path
    run = await browser.form(f"/ui/skills/{SKILL}/run", {"command": "true"})
    assert run.status_code == 303 and run.headers["location"] == "/ui/login"
    assert runs_of(console) == []
    assert await stored(console.sessions, browser.token) is None  # ended, not only refused
    console.services.teams.create_key("team-a")  # a new key of the team does not bring it back
    assert (await browser.get("/ui/skills")).headers.get("location") == "/ui/login"
    assert (await other_team.get("/ui/skills")).status_code == 200
    again = Browser(console.client())
    login = await again.get("/ui/login")
    refused = await again.post("/ui/login", data={"key": console.keys["team-a"], "csrf": csrf_of(login.text)})
    assert refused.status_code == 401 and SESSION_COOKIE not in refused.headers.get("set-cookie", "")


async def _expire(console: Console, token: str) -> None:
    """Put the session's expiry in the past while the store still holds it (a clock past its 8 hours)."""
    sessions = console.sessions
    session = await stored(sessions, token)
    session.expires_at = time.time() - 1
    if isinstance(sessions, MemoryConsoleSessions):
        sessions._sessions[digest(token)] = session
    else:
        await sessions.redis.set(sessions._key(digest(token)), session.model_dump_json(), ex=60)


async def test_an_expired_session_is_refused_even_while_the_store_still_holds_it(any_store):
    console = any_store
    browser = await console.browser()
    assert (await stored(console.sessions, browser.token)).expires_at <= time.time() + EIGHT_HOURS
    await _expire(console, browser.token)
    assert (await browser.get("/ui/skills")).headers.get("location") == "/ui/login"
    assert (await browser.form("/ui/logout")).headers.get("location") == "/ui/login"


async def test_a_team_keeps_at_most_fifty_sessions_and_the_oldest_end_first(any_store):
    console = any_store
    other = await console.browser("team-b")
    browsers = [await console.browser("team-a") for _ in range(PER_TEAM + 2)]
    for old in browsers[:2]:
        assert (await old.get("/ui/skills")).headers.get("location") == "/ui/login"
        assert await stored(console.sessions, old.token) is None
    for kept in (browsers[2], browsers[-1]):
        assert (await kept.get("/ui/skills")).status_code == 200
    assert (await other.get("/ui/skills")).status_code == 200  # another team's sign-ins do not count
    if isinstance(console.sessions, RedisConsoleSessions):
        assert await console.sessions.redis.zcard(f"{RedisConsoleSessions.PREFIX}:team:team-a") == PER_TEAM
    else:
        assert sum(s.team_id == "team-a" for s in console.sessions._sessions.values()) == PER_TEAM


async def test_the_session_store_keeps_only_a_digest_of_the_token_with_an_expiry(any_store):
    console = any_store
    browser = await console.browser()
    token = browser.token
    sessions = console.sessions
    if isinstance(sessions, RedisConsoleSessions):
        keys = [k.decode() for k in await sessions.redis.keys("*")]
        assert f"{RedisConsoleSessions.PREFIX}:session:{digest(token)}" in keys
        dumped = "".join(keys) + "".join([(await sessions.redis.get(k) or b"").decode(errors="replace")
                                          for k in keys if ":session:" in k])
        ttl = await sessions.redis.ttl(f"{RedisConsoleSessions.PREFIX}:session:{digest(token)}")
        assert 0 < ttl <= EIGHT_HOURS
    else:
        dumped = repr(sessions._sessions)
        assert digest(token) in sessions._sessions
    assert token not in dumped and (await stored(sessions, token)).key_id == console.key_ids["team-a"]


async def test_the_json_api_does_not_take_the_console_cookie(console):
    browser = await console.browser()
    async with cookie_client(console, browser.token) as api:
        for path in ("/v1/runs", "/v1/libraries", "/v1/skills"):
            assert (await api.get(path)).status_code == 401, path
        assert (await api.post("/v1/runs", json={"skill": SKILL, "command": "true"})).status_code == 401
    assert runs_of(console) == []


async def test_console_answers_allow_no_other_origin_to_read_them(console):
    browser = await console.browser()
    for answer in (await browser.get("/ui/skills", headers={"Origin": "https://evil.example"}),
                   await browser.http.options("/ui/login", headers={"Origin": "https://evil.example",
                                                                      "Access-Control-Request-Method": "POST"})):
        assert not any(h.startswith("access-control-allow") for h in answer.headers), answer.headers


# ----------------------------------------------------------------------------------------------------------------
# 2. Tenancy: one team's cookie reaches nothing of another's


async def test_another_team_s_runs_files_artifacts_and_events_are_not_found(console):
    finished = plant_run(console, "team-a", stdout="TEAM-A-SECRET-OUTPUT",
                         output_files=[text_file("out/secret.txt", "TEAM-A-SECRET-FILE")],
                         artifacts=[("secret.bin", b"TEAM-A-SECRET-ARTIFACT", "application/octet-stream")])
    queued = plant_run(console, "team-a", RunStatus.QUEUED)
    owner, intruder = await console.browser("team-a"), await console.browser("team-b")
    reads = [f"/ui/runs/{finished}", f"/ui/runs/{finished}/events", f"/ui/runs/{finished}/files/out/secret.txt",
             f"/ui/runs/{finished}/artifacts/secret.bin", f"/ui/runs/{queued}", f"/ui/runs/{queued}/events"]
    for path in reads[:4]:
        assert (await owner.get(path)).status_code == 200, path  # they are there, for their own team
    for path in reads:
        answer = await intruder.get(path)
        assert answer.status_code == 404, (path, answer.status_code)
        assert "TEAM-A-SECRET" not in answer.text, path
    cancel = await intruder.form(f"/ui/runs/{queued}/cancel")
    assert cancel.status_code == 404
    assert console.services.dispatcher.store.get(queued).status == RunStatus.QUEUED
    for listing in (await intruder.get("/ui/runs"), await intruder.get("/ui/runs", params={"skill": SKILL}),
                    await intruder.get("/ui/runs", params={"status": "queued"})):
        assert finished not in listing.text and queued not in listing.text


async def test_another_team_s_libraries_and_private_skills_are_not_found(console):
    for n in (1, 2):
        install_library(console, "team-a", "private-lib", {
            "secret-skill/SKILL.md": skill_md("secret-skill", "TEAM-A-SECRET-BODY\n", description="TEAM-A-SECRET"),
            "secret-skill/guide.md": b"TEAM-A-SECRET-DOC\n", f"v{n}.txt": b"x"})
    intruder = await console.browser("team-b")
    libraries = await intruder.get("/ui/libraries")
    assert "private-lib" not in libraries.text and "TEAM-A-SECRET" not in libraries.text
    search = await intruder.get("/ui/skills", params={"q": "TEAM-A-SECRET"})
    assert "secret-skill" not in search.text
    for path in ("/ui/skills/secret-skill", "/ui/skills/secret-skill/docs/guide.md"):
        answer = await intruder.get(path)
        assert answer.status_code == 404 and "TEAM-A-SECRET" not in answer.text, path
    run = await intruder.form("/ui/skills/secret-skill/run", {"command": "cat SKILL.md"})
    assert run.status_code == 404 and runs_of(console, "team-b") == []
    current = await intruder.form("/ui/libraries/private-lib/current", {"version": "1"})
    assert current.status_code == 404 and current_version(console, "team-a", "private-lib") == 2
    owner = await console.browser("team-a")
    assert "TEAM-A-SECRET-BODY" in (await owner.get("/ui/skills/secret-skill")).text  # the control


async def test_the_operator_page_shows_other_teams_counts_but_none_of_their_runs(console):
    plant_run(console, "team-b", skill="team-b-skill-name", stdout="TEAM-B-SECRET")
    started = plant_run(console, "team-b", RunStatus.STARTED, skill="team-b-skill-name")
    install_library(console, "team-b", "team-b-library", {"x/SKILL.md": skill_md("x", "x\n")})
    page = await (await console.browser("team-a")).get("/ui/operator")
    assert page.status_code == 200
    for private in ("team-b", "TEAM-B-SECRET", started, "team-b-skill-name", "team-b-library", "planted"):
        assert private not in page.text, private
    assert "1 running now" in page.text


# ----------------------------------------------------------------------------------------------------------------
# 3. Redirects stay on the console; paths stay in their folders


async def test_every_redirect_stays_on_the_console_whatever_the_request_asks(console):
    browser = Browser(console.client())
    login = await browser.get("/ui/login", params={"next": "https://evil.example/"})
    signed = await browser.post("/ui/login", params={"next": "https://evil.example/", "redirect": "//evil.example"},
                                data={"key": console.keys["team-a"], "csrf": csrf_of(login.text),
                                      "next": "https://evil.example/", "return_to": "//evil.example/"},
                                headers={"Referer": "https://evil.example/"})
    assert signed.headers["location"] == "/ui/skills"
    browser.csrf = csrf_of((await browser.get("/ui/skills")).text)
    queued = plant_run(console, "team-a", RunStatus.QUEUED)
    answers = [signed, await browser.get("/ui", params={"next": "//evil.example"}),
               await browser.form(f"/ui/runs/{queued}/cancel", {"next": "https://evil.example"}),
               await browser.form(f"/ui/skills/{SKILL}/run", {"command": "true", "next": "//evil.example"}),
               await console.client().get("/ui/runs?next=//evil.example")]
    for raw in ("/ui//evil.example/", "/ui/skills//evil.example/", "/ui/%2F%2Fevil.example/", "/ui/skills/"):
        status, headers, _ = await asgi(console.app, "GET", raw)
        if "location" in headers:
            answers.append(httpx.Response(status, headers=headers))
    answers.append(await browser.form("/ui/logout", {"next": "https://evil.example"}))
    for answer in answers:
        assert answer.status_code in (303, 307), answer.status_code
        location = urllib.parse.urlsplit(answer.headers["location"])
        assert location.netloc in ("", HOST) and location.path.startswith("/ui"), answer.headers["location"]
        assert not answer.headers["location"].startswith("//")


@pytest.mark.parametrize("raw", [
    "/ui/static/../auth.py", "/ui/static/..%2fauth.py", "/ui/static/%2e%2e/auth.py", "/ui/static/%2e%2e%2fauth.py",
    "/ui/static/../templates/base.html", "/ui/static/../../../../../../etc/passwd", "/ui/static//etc/passwd",
    "/ui/static/%2fetc%2fpasswd", "/ui/static/....//auth.py", "/ui/static/console.js%00.py",
    "/ui/static/..\\auth.py", "/ui/static/%5c..%5cauth.py",
])
async def test_static_files_cannot_be_left_for_the_console_s_code_or_the_host(console, raw):
    status, headers, body = await asgi(console.app, "GET", raw)
    assert status == 404, (raw, status, body[:200])
    assert b"import " not in body and b"root:x:0:0" not in body and b"{% block" not in body


async def test_doc_file_and_skill_paths_cannot_climb_out(console):
    install_library(console, "team-a", "attack", {"evil/SKILL.md": skill_md("evil", "x\n"),
                                                  "evil/guide.md": b"guide\n", "private.md": b"LIBRARY-ROOT\n"})
    run_id = plant_run(console, "team-a", output_files=[text_file("out/a.txt", "a")])
    browser = await console.browser()
    cookie = [("cookie", f"{SESSION_COOKIE}={browser.token}")]
    for raw in ("/ui/skills/evil/docs/../SKILL.md", "/ui/skills/evil/docs/..%2fSKILL.md",
                "/ui/skills/evil/docs/%2e%2e/%2e%2e/private.md", "/ui/skills/evil/docs/..%2f..%2fprivate.md",
                "/ui/skills/evil/docs//etc/passwd", "/ui/skills/evil/docs/%2fetc%2fpasswd",
                "/ui/skills/evil/docs/..%2fprivate.md", "/ui/skills/evil/docs/guide.md/../SKILL.md",
                "/ui/skills/evil/docs/./guide.md%00",
                "/ui/skills/..", "/ui/skills/%2e%2e", "/ui/skills/..%2f..%2fetc", "/ui/skills/evil%2f..%2fevil",
                f"/ui/runs/{run_id}/files/out/../../../../etc/passwd",
                f"/ui/runs/{run_id}/files/..%2f..%2fetc%2fpasswd",
                f"/ui/runs/{run_id}/files//etc/passwd", f"/ui/runs/{run_id}/files/out/a.txt/..",
                f"/ui/runs/{run_id}/files/out/./a.txt", f"/ui/runs/{run_id}/artifacts/../../../etc/passwd",
                f"/ui/runs/{run_id}/artifacts/..%2f..%2fsecret"):
        status, _, body = await asgi(console.app, "GET", raw, cookie)
        assert status in (404, 422), (raw, status)
        assert b"root:x:0:0" not in body and b"LIBRARY-ROOT" not in body and b"name: evil" not in body, raw
