"""The console under attack and what its attack tests share (``tests/attacks/test_console_*_attacks.py``).

``console`` is the real API app (``create_app``, its middleware, the console's routes, sessions and templates) with
its lifespan running, for teams ``team-a`` and ``team-b``, reached in-process through ``httpx.ASGITransport``;
``any_store`` is the same with its sessions in memory, then in a real Redis. A ``Browser`` signs in the way a
browser does (the login form's double-submit cookie, then the session cookie). Runs are never executed: the
dispatcher only accepts them, and ``plant_run`` puts the runs whose pages are attacked in its run store with the
output, files, events and artifacts an attacking skill could produce; ``install_library`` gives a team a library.
``active_content`` lists whatever in a page could run script. A test module takes the fixtures by importing them.
"""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
import time
import urllib.parse
from collections.abc import Awaitable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from orchestrator.api import create_app
from orchestrator.console.sessions import BaseConsoleSessions, RedisConsoleSessions
from orchestrator.services import run_ids
from tests.orchestrator.test_api_teams import tar_gz
from worker.contract import OutputFile, RunRequest, RunResult, RuntimeName, SkillRef
from worker.run_store import RunEvent, RunRecord, RunStatus

HOST = "console.test"
SESSION_COOKIE = "skillrun_session"
LOGIN_COOKIE = "skillrun_login"
TEAMS = ("team-a", "team-b")
SKILL = "python-math"
"""A skill of the repo's library (what a team without libraries of its own sees)."""


# ----------------------------------------------------------------------------------------------------------------
# The console, browsers and planted objects


@dataclass
class Console:
    app: object
    services: object
    keys: dict[str, str]
    key_ids: dict[str, str]
    tmp: Path

    def client(self, https: bool = False) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                 base_url=f"{'https' if https else 'http'}://{HOST}", follow_redirects=False)

    @property
    def sessions(self) -> BaseConsoleSessions:
        return self.app.state.console_sessions

    async def browser(self, team: str | None = "team-a", https: bool = False) -> Browser:
        """A browser (an httpx client keeping cookies), signed in as ``team`` unless it is ``None``."""
        browser = Browser(self.client(https))
        if team is not None:
            await browser.sign_in(self.keys[team])
        return browser


@dataclass
class Browser:
    http: httpx.AsyncClient
    csrf: str = ""

    async def sign_in(self, key: str) -> httpx.Response:
        form = await self.http.get("/ui/login")
        answer = await self.http.post("/ui/login", data={"key": key, "csrf": csrf_of(form.text)})
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/skills", answer.text
        self.csrf = csrf_of((await self.http.get("/ui/skills")).text)
        return answer

    @property
    def token(self) -> str:
        return self.http.cookies.get(SESSION_COOKIE, domain=HOST, path="/ui") or ""

    def get(self, url: str, **kwargs) -> Awaitable[httpx.Response]:
        return self.http.get(url, **kwargs)

    def post(self, url: str, **kwargs) -> Awaitable[httpx.Response]:
        return self.http.post(url, **kwargs)

    async def form(self, url: str, fields: dict[str, str] | None = None, **kwargs) -> httpx.Response:
        """A form POST carrying the session's CSRF token."""
        return await self.http.post(url, data={"csrf": self.csrf, **(fields or {})}, **kwargs)


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, f"no csrf field in the page:\n{page[:2000]}"
    return found[1]


def cookie_client(console: Console, token: str) -> httpx.AsyncClient:
    """A fresh client sending ``token`` as the session cookie (a stolen or replayed cookie)."""
    client = console.client()
    client.cookies.set(SESSION_COOKIE, token, domain=HOST, path="/ui")
    return client


@pytest.fixture
async def console(services, tmp_path) -> Console:
    """The API app with the console, teams ``team-a`` and ``team-b`` (a key each), its lifespan running. Runs
    submitted are accepted (recorded, queued) but never executed."""
    keys, key_ids = {}, {}
    for team in TEAMS:
        services.teams.create_team(team)
        record, keys[team] = services.teams.create_key(team)
        key_ids[team] = record.id
    dispatcher = services.dispatcher

    async def accept_only(request, *, trusted=False, priority=False, owner=None):
        record, _ = await dispatcher._accept(request, owner)
        return record

    dispatcher.submit = accept_only
    app = create_app(services=services)
    started, stop = asyncio.Event(), asyncio.Event()

    async def lifespan() -> None:  # in a task of its own: the fixture's setup and teardown run in different tasks
        async with app.router.lifespan_context(app):
            started.set()
            await stop.wait()

    task = asyncio.create_task(lifespan())
    while not started.is_set():
        if task.done():
            task.result()
        await asyncio.sleep(0.001)
    yield Console(app=app, services=services, keys=keys, key_ids=key_ids, tmp=tmp_path)
    stop.set()
    await task


@pytest.fixture(params=["memory", "redis"])
async def any_store(request, console) -> Console:
    """The console with its sessions in memory (the embedded default), then in a real Redis."""
    if request.param == "redis":
        memory = console.sessions
        store = RedisConsoleSessions(request.getfixturevalue("redis_url"), ttl_seconds=memory.ttl_seconds,
                                     per_team=memory.per_team)
        console.app.state.console_sessions = store
        yield console
        await store.aclose()
    else:
        yield console


def plant_run(console: Console, team: str, status: RunStatus = RunStatus.FINISHED, *, skill: str = SKILL,
              error: str | None = None, reason: str | None = None, **result) -> str:
    """A run of ``team`` in the run store as an attacking skill could leave it: queued, or ended with ``result``."""
    store = console.services.dispatcher.store
    run_id = run_ids.mint(team)
    workspace = f"{team}.{secrets.token_hex(8)}"
    store.create(RunRequest(run_id=run_id, skill=SkillRef(name=skill, root=str(console.tmp), path=skill),
                            command="planted", workspace_id=workspace, keep_workspace=False), owner=team)
    if status == RunStatus.QUEUED:
        return run_id
    artifacts = []
    for name, data, mime in result.pop("artifacts", []):
        artifacts.append(console.services.artifact_store.save_bytes(workspace, name, data, mime))

    def end(record: RunRecord) -> RunEvent:
        record.status, record.error = status, error
        record.started_at = record.finished_at = time.time()
        if status == RunStatus.STARTED:
            record.finished_at = None
            return RunEvent(type="started")
        record.result = RunResult(exit_code=0, run_id=run_id, workspace_id=workspace, runtime=RuntimeName.LOCAL,
                                  artifact_files=artifacts, **result)
        return RunEvent(type=status.value, data={"reason": reason} if reason else {})

    store.update(run_id, end)
    return run_id


def text_file(name: str, content: str, mime: str = "text/plain") -> OutputFile:
    return OutputFile(name=name, content=content, mime_type=mime, size=len(content.encode()))


def binary_file(name: str, data: bytes, mime: str) -> OutputFile:
    return OutputFile(name=name, content=base64.b64encode(data).decode(), encoding="base64", mime_type=mime,
                      size=len(data))


def install_library(console: Console, team: str, name: str, files: dict[str, bytes],
                    filename: str = "lib.tar.gz") -> None:
    """A new current version of ``team``'s library ``name`` holding ``files``."""
    archive = console.tmp / f"{secrets.token_hex(4)}.tar.gz"
    archive.write_bytes(tar_gz(files))
    console.services.libraries.add_from_file(team, name, archive, filename)


async def asgi(app, method: str, raw_path: str, headers: list[tuple[str, str]] | None = None,
               body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request straight to the ASGI app with ``raw_path`` exactly as sent (no client normalising ``..``)."""
    path, _, query = raw_path.partition("?")
    messages: list[dict] = []
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        messages.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": urllib.parse.unquote(path), "raw_path": path.encode(), "query_string": query.encode(),
             "root_path": "", "server": (HOST, 80), "client": ("203.0.113.9", 40000),
             "headers": [(b"host", HOST.encode()), *((k.lower().encode(), v.encode()) for k, v in headers or [])]}
    await app(scope, receive, send)
    start = next(m for m in messages if m["type"] == "http.response.start")
    answer = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, answer


# ----------------------------------------------------------------------------------------------------------------
# What in a page could run script


_SAFE_SCHEMES = {"http", "https", "mailto"}
_URL_ATTRIBUTES = {"href", "src", "action", "formaction", "xlink:href", "data", "poster", "background", "srcset",
                   "ping", "cite", "codebase", "dynsrc", "lowsrc"}
_NEVER = {"iframe", "frame", "frameset", "object", "embed", "applet", "base", "style", "svg", "math", "template",
          "portal", "noembed", "xmp", "plaintext", "listing", "isindex"}


class _ActiveContent(HTMLParser):
    """Everything in an HTML document or fragment that could run script or leave the page other than the console's
    own markup (its one script, stylesheet, meta tags and forms posting to ``/ui``)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if tag in _NEVER:
            self.found.append(f"<{tag}>")
        elif tag == "script" and values != {"src": "/ui/static/console.js", "defer": ""}:
            self.found.append(f"<script {values}>")
        elif tag == "link" and values != {"rel": "stylesheet", "href": "/ui/static/console.css"}:
            self.found.append(f"<link {values}>")
        elif tag == "meta" and not (values.keys() == {"charset"} or values.get("name") == "viewport"
                                    or values == {"http-equiv": "refresh", "content": "3"}):
            self.found.append(f"<meta {values}>")
        elif tag == "form" and not values.get("action", "").startswith("/ui/"):
            self.found.append(f"<form {values}>")
        for name, value in values.items():
            if name.startswith("on") or name in {"srcdoc", "style", "formaction", "http-equiv"} and tag != "meta":
                self.found.append(f"{tag}[{name}={value!r}]")
            if name in _URL_ATTRIBUTES:
                compact = re.sub(r"[\x00-\x20\x7f]", "", value).lower()
                scheme = re.match(r"^([a-z][a-z0-9+.\-]*):", compact)
                if scheme and scheme[1] not in _SAFE_SCHEMES:
                    self.found.append(f"{tag}[{name}={value!r}]")

    handle_startendtag = handle_starttag


def active_content(html: str) -> list[str]:
    parser = _ActiveContent()
    parser.feed(html)
    parser.close()
    return parser.found


# ----------------------------------------------------------------------------------------------------------------
# What a test asks of the run store and the libraries


def runs_of(console: Console, team: str = "team-a") -> list[RunRecord]:
    return console.services.dispatcher.store.list(None, 1000, owner=team)


def current_version(console: Console, team: str, name: str) -> int | None:
    library = console.services.libraries.get(team, name)
    return library.current if library else None
