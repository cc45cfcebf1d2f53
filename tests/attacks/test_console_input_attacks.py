"""Attacks on the web console at ``/ui`` through what every answer carries and what every request may hold: the
security headers on every answer (pages, errors, redirects, 413s, lost runs, static files, event streams,
downloads), odd input that could make a 500 or change something, and bodies past their bounds (4 MiB for every form
but the archive upload).

Every test drives the real API app in-process through ``httpx.ASGITransport`` (or straight through ASGI and its body
limit middleware where a request must reach it as sent), signed in as a browser is (the ``console`` fixture and
helpers of ``tests.attacks.console_fixtures``). Each test's name says what it defends; a test marked
``xfail(strict=True)`` would be an attack that still gets through (its reason saying what); none is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest
from starlette.exceptions import HTTPException

from orchestrator.api.limits import (
    JSON_BODY_BYTES,
    UPLOAD_BODY_BYTES,
    BodyLimitMiddleware,
    body_limit,
)
from orchestrator.services import run_ids
from tests.attacks.console_fixtures import (
    SKILL,
    Browser,
    Console,
    active_content,
    asgi,
    console,  # noqa: F401 - the fixture
    cookie_client,
    current_version,
    install_library,
    plant_run,
    runs_of,
    text_file,
)
from tests.orchestrator.test_api_teams import skill_md, tar_gz
from worker.run_store import RunStatus

MiB = 1024 * 1024
DESIGN_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
              "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
"""The policy the design gives every console page (written out here, so that a weaker one in the code fails)."""
REFERRER_POLICIES = {"no-referrer", "same-origin"}
"""The design says no-referrer; same-origin (the code's choice, so that form posts carry a real Origin) also keeps
every address of the console from other sites."""


# ----------------------------------------------------------------------------------------------------------------
# 1. Headers on every answer under /ui


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
# 2. Odd input is refused (or harmless), never a 500


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
    assert runs_of(console) == []
    assert [library.name for library in console.services.libraries.list("team-a")] == ["lib"]
    assert current_version(console, "team-a", "lib") == 2


# ----------------------------------------------------------------------------------------------------------------
# 3. Body bounds: 4 MiB for every console form but the archive upload


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
    assert runs_of(console) == []


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
