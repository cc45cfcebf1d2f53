"""What the web console (issue #20) must never let through, tried in Debian's Chromium driven by Selenium: one
team's runs, files and libraries seen or acted on by another; scripts from a skill's SKILL.md and docs or from a
run's output; HTML and SVG output files rendered instead of downloaded; posts (every form and the login) without the
form's CSRF token.

Requests a page would never send (another team's ids, forged or missing tokens) go through httpx with the browser's
session cookie, against the same server.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.console.conftest import (
    REPO_SKILLS,
    RUN_PAGE,
    SESSION_COOKIE,
    Console,
    api_run,
    csp_violations,
    csrf_token,
    open_page,
    output_file_row,
    runs_of,
    session_client,
    session_cookie,
    signed_in,
    submit_run,
    texts,
    wait_for,
    wait_for_download,
    wait_for_path,
    wait_until_ended,
)
from tests.file_server import FileServer
from tests.orchestrator.api_helpers import new_team
from tests.orchestrator.test_api_teams import skill_md, tar_gz

pytestmark = pytest.mark.slow  # each test starts a server and Chromium: a few seconds apiece


# ----------------------------------------------------------------------------------------------------------------
# Helpers


def upload_library(console: Console, team: str, name: str, archive: bytes, filename: str = "lib.tar.gz") -> dict:
    """A library version uploaded through the JSON API."""
    with console.api(team) as api:
        answer = api.post(f"/v1/libraries/{name}/upload", params={"filename": filename}, content=archive)
    assert answer.status_code == 201, answer.text
    return answer.json()


def pwned(driver: WebDriver) -> object:
    return driver.execute_script("return window.__pwned")


def active_content(driver: WebDriver, root: str) -> list[str]:
    """What under ``root`` (CSS) could run script: script/iframe/object/embed elements, ``on*`` attributes,
    ``javascript:`` links (however spelt), ``srcdoc`` attributes; as short descriptions."""
    return driver.execute_script("""
        const root = document.querySelector(arguments[0]);
        if (!root) return ['no ' + arguments[0]];
        const found = [];
        for (const e of root.querySelectorAll('*')) {
            const tag = e.tagName.toLowerCase();
            if (['script', 'iframe', 'frame', 'object', 'embed', 'base', 'meta', 'link', 'form'].includes(tag))
                found.push('<' + tag + '>');
            for (const a of e.attributes) {
                const name = a.name.toLowerCase();
                const value = a.value.replace(/[\\s\\u0000-\\u001f]/g, '').toLowerCase();
                if (name.startsWith('on') || name === 'srcdoc') found.push(tag + '[' + name + ']');
                if (['href', 'src', 'action', 'formaction', 'xlink:href', 'data'].includes(name)
                        && (value.startsWith('javascript:') || value.startsWith('vbscript:')
                            || value.startsWith('data:text/html')))
                    found.push(tag + '[' + name + '=' + a.value + ']');
            }
        }
        return found;
    """, root)


# ----------------------------------------------------------------------------------------------------------------
# Tenancy


def test_team_b_sees_none_of_team_a_s_runs_files_or_libraries(console, browser):
    run = api_run(console, {"skill": "python-math", "command": "python3 scripts/fib.py 5 > out/fib.txt",
                            "output_files": ["out/fib.txt"]})
    upload_library(console, "team-a", "secret-lib", tar_gz({"a-only/SKILL.md": skill_md("a-only")}))

    a = signed_in(browser, console, "team-a")
    open_page(a, console, f"/ui/runs/{run['id']}", "#run-status")
    b = signed_in(browser, console, "team-b")
    assert "a-only" not in texts(b, "table#skills a.skill-name")
    assert texts(b, "table#skills a.skill-name") == REPO_SKILLS
    open_page(b, console, "/ui/runs", "table#runs")
    assert b.find_elements(By.CSS_SELECTOR, "table#runs tr.run") == []
    b.get(f"{console.url}/ui/runs/{run['id']}")
    assert not b.find_elements(By.CSS_SELECTOR, "#run-status")
    assert "fib" not in b.page_source and "python-math" not in b.find_element(By.TAG_NAME, "body").text
    open_page(b, console, "/ui/libraries", "#upload-form")
    assert b.find_elements(By.CSS_SELECTOR, "section.library") == []
    assert "secret-lib" not in b.page_source
    b.get(f"{console.url}/ui/skills/a-only")
    assert not b.find_elements(By.CSS_SELECTOR, "#run-form")

    with session_client(console.url, session_cookie(b)) as theirs, session_client(console.url, session_cookie(a)) as ours:
        for path in (f"/ui/runs/{run['id']}", f"/ui/runs/{run['id']}/events",
                     f"/ui/runs/{run['id']}/files/out/fib.txt", "/ui/skills/a-only"):
            assert theirs.get(path).status_code == 404, path
        assert ours.get(f"/ui/runs/{run['id']}/files/out/fib.txt").content == b"0\n1\n1\n2\n3\n"
        assert ours.get("/ui/skills/a-only").status_code == 200
        # team-b's forms cannot act on team-a's run or library
        token = _page_token(theirs, "/ui/libraries")
        for path, data in ((f"/ui/runs/{run['id']}/cancel", {}), ("/ui/libraries/secret-lib/current", {"version": "1"})):
            answer = theirs.post(path, data={"csrf": token, **data})
            assert answer.status_code in (404, 405), (path, answer.status_code)


def _page_token(client: httpx.Client, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200, (path, page.status_code)
    found = re.search(r'name="csrf"[^>]*value="([^"]+)"|value="([^"]+)"[^>]*name="csrf"', page.text)
    assert found, f"no csrf field on {path}"
    return found.group(1) or found.group(2)


# ----------------------------------------------------------------------------------------------------------------
# Nothing a skill or a run wrote runs in the console


EVIL_BODY = """# Evil

<script>window.__pwned = 1</script>

<img src="x" onerror="window.__pwned = 2">

[link](javascript:window.__pwned=3)

[spaced link]( JaVaScRiPt:window.__pwned=3)

<a href="javascript:window.__pwned=4">raw link</a>

<svg onload="window.__pwned = 5"><circle r="5"/></svg>

<iframe src="javascript:parent.__pwned=6"></iframe>

<details open ontoggle="window.__pwned = 7">x</details>

<math><mtext><table><mglyph><style><img src=x onerror="window.__pwned = 8">

Plain **bold** text survives.
"""


def test_skill_markdown_with_scripts_and_handlers_runs_nothing(console, browser):
    key = new_team(console.services, "team-evil")
    console.keys["team-evil"] = key
    upload_library(console, "team-evil", "evil", tar_gz({
        "evil/SKILL.md": skill_md("evil", EVIL_BODY, "Evil <img src=x onerror=window.__pwned=9> <b>skill</b>"),
        "evil/EVIL.md": b"# Doc\n\n<script>window.__pwned = 10</script>\n<img src=x onerror='window.__pwned=11'>\n",
    }))
    driver = signed_in(browser, console, "team-evil")
    description = driver.find_element(By.CSS_SELECTOR, "table#skills tr.skill td.skill-description")
    assert "<img src=x onerror=window.__pwned=9>" in description.text
    assert description.find_elements(By.CSS_SELECTOR, "*") == []

    driver.find_element(By.CSS_SELECTOR, "table#skills a.skill-name").click()
    wait_for_path(driver, r"/ui/skills/evil")
    wait_for(driver, lambda d: d.execute_script("return document.readyState") == "complete", "the page loaded")
    time.sleep(1)  # an image's error handler, had it survived, has run by now
    assert pwned(driver) is None
    assert active_content(driver, "#skill-body") == []
    body = driver.find_element(By.CSS_SELECTOR, "#skill-body")
    assert body.find_elements(By.CSS_SELECTOR, "strong") and "Plain bold text survives." in body.text
    page = driver.current_url
    for link in body.find_elements(By.CSS_SELECTOR, "a"):
        if link.text in ("link", "spaced link", "raw link") and link.is_displayed():
            link.click()
            time.sleep(0.3)
            assert pwned(driver) is None
            if driver.current_url != page:
                driver.get(page)
                body = driver.find_element(By.CSS_SELECTOR, "#skill-body")
    assert pwned(driver) is None
    assert csp_violations(driver) == [], "something the sanitiser kept tried to run (the policy stopped it)"

    docs = driver.find_elements(By.CSS_SELECTOR, "#docs a.doc")
    assert [d.text for d in docs] == ["EVIL.md"]
    docs[0].click()
    wait_for_path(driver, r"/ui/skills/evil/docs/EVIL\.md")
    time.sleep(1)
    assert pwned(driver) is None
    assert active_content(driver, "#doc-body") == []


def test_run_output_with_markup_and_control_characters_is_text_and_html_files_are_not_rendered(console, browser):
    driver = signed_in(browser, console)
    command = (r"printf '\033[31mred\033[0m <script>window.__pwned=4</script>\n'; "
               r"printf '<img src=x onerror=window.__pwned=5>\n' >&2; "
               r"printf '<script>window.__pwned=6</script><b>bold</b>' > out/x.html; "
               r"printf '<svg xmlns=\"http://www.w3.org/2000/svg\" onload=\"window.__pwned=7\"/>' > out/y.svg; "
               r"printf 'plain' > out/z.txt")
    run_id = submit_run(driver, console, "python-math", command, output_files=("out/*",))
    assert wait_until_ended(driver) == "finished"
    time.sleep(1)
    assert pwned(driver) is None
    stdout = driver.find_element(By.CSS_SELECTOR, "pre#stdout")
    assert "<script>window.__pwned=4</script>" in stdout.text and "red" in stdout.text, stdout.text
    assert stdout.find_elements(By.CSS_SELECTOR, "script, img, iframe") == []
    assert "&lt;script&gt;" in stdout.get_attribute("innerHTML")
    stderr = driver.find_element(By.CSS_SELECTOR, "pre#stderr")
    assert "<img src=x onerror=window.__pwned=5>" in stderr.text
    assert stderr.find_elements(By.CSS_SELECTOR, "*") == []
    for shown in ("pre#stdout", "pre#stderr", "table#files"):
        assert active_content(driver, shown) == [], shown
    assert driver.find_elements(By.CSS_SELECTOR, "iframe, object, embed, frame") == []

    for name in ("out/x.html", "out/y.svg", "out/z.txt"):
        output_file_row(driver, name)
    previews = [p.text for p in driver.find_elements(By.CSS_SELECTOR, ".preview")]
    assert not any("pwned" in text for text in previews), previews
    assert not [i.get_attribute("src") for i in driver.find_elements(By.CSS_SELECTOR, "img.preview")
                if "y.svg" in i.get_attribute("src") or "x.html" in i.get_attribute("src")]
    assert [p.text for p in driver.find_elements(By.CSS_SELECTOR, "pre.preview")] == ["plain"]

    with session_client(console.url, session_cookie(driver)) as c:
        for name, mime in (("out/x.html", "text/html"), ("out/y.svg", "image/svg+xml")):
            answer = c.get(f"/ui/runs/{run_id}/files/{name}")
            assert answer.status_code == 200, (name, answer.status_code)
            assert answer.headers["content-disposition"].startswith("attachment"), (name, dict(answer.headers))
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["content-type"].startswith(mime), answer.headers["content-type"]
    # Opening the HTML file's download link in the browser saves it, it is not shown.
    output_file_row(driver, "out/x.html").find_element(By.CSS_SELECTOR, "a.download").click()
    saved = wait_for_download(driver.downloads)
    assert saved.read_bytes() == b"<script>window.__pwned=6</script><b>bold</b>"
    assert pwned(driver) is None


# ----------------------------------------------------------------------------------------------------------------
# CSRF


def test_posts_without_the_session_s_csrf_token_are_refused_and_change_nothing(console, browser):
    a = signed_in(browser, console, "team-a")
    open_page(a, console, "/ui/skills/python-math", "#run-form")
    token = csrf_token(a, "#run-form")
    action = a.find_element(By.CSS_SELECTOR, "#run-form").get_attribute("action")
    assert action == f"{console.url}/ui/skills/python-math/run", action
    logout = a.find_element(By.CSS_SELECTOR, "button#sign-out").find_element(By.XPATH, "./ancestor::form")
    assert logout.get_attribute("action") == f"{console.url}/ui/logout"
    assert logout.get_attribute("method").lower() == "post"
    b = signed_in(browser, console, "team-b")
    open_page(b, console, "/ui/skills/python-math", "#run-form")
    other_token = csrf_token(b, "#run-form")
    assert other_token != token

    form = {"command": "echo should-not-run", "output_files": "", "env": "", "runtime": "local", "timeout": "30"}
    with session_client(console.url, session_cookie(a)) as c:
        for csrf in (None, "", "wrong", other_token, token + "x"):
            data = form if csrf is None else {**form, "csrf": csrf}
            answer = c.post("/ui/skills/python-math/run", data=data)
            assert answer.status_code == 403, (csrf, answer.status_code, answer.text[:300])
            answer = c.post("/ui/logout", data={} if csrf is None else {"csrf": csrf})
            assert answer.status_code == 403, (csrf, answer.status_code)
        assert runs_of(console) == []
        assert c.get("/ui/skills").status_code == 200, "a refused sign-out still ended the session"
        # the form's own token (and only it) is taken
        sent = c.post("/ui/skills/python-math/run", data={**form, "command": "echo ok", "csrf": token})
        assert sent.status_code == 303 and re.fullmatch(RUN_PAGE, httpx.URL(sent.headers["location"]).path)
        assert len(runs_of(console)) == 1
        # a request from another site (the browser sends no cookie: SameSite=Strict) and a form without a session
        with session_client(console.url, None) as anonymous:
            answer = anonymous.post("/ui/skills/python-math/run", data={**form, "csrf": token})
            assert answer.status_code in (303, 403), answer.status_code
        assert len(runs_of(console)) == 1

        # the login form: a key posted without the login page's own token (double submit) opens no session
        with session_client(console.url, None) as anonymous:
            for data in ({"key": console.keys["team-a"]}, {"key": console.keys["team-a"], "csrf": "forged"}):
                answer = anonymous.post("/ui/login", data=data)
                assert answer.status_code == 403 and SESSION_COOKIE not in answer.headers.get("set-cookie", ""), \
                    (data, answer.status_code, answer.headers.get("set-cookie"))
        signed_out = c.post("/ui/logout", data={"csrf": token})
        assert signed_out.status_code == 303 and signed_out.headers["location"].endswith("/ui/login")
        assert c.get("/ui/skills").status_code == 303


def test_library_forms_refuse_posts_without_the_csrf_token(console, browser, tmp_path):
    driver = signed_in(browser, console)
    open_page(driver, console, "/ui/libraries", "#upload-form")
    upload_action = driver.find_element(By.CSS_SELECTOR, "#upload-form").get_attribute("action")
    register_action = driver.find_element(By.CSS_SELECTOR, "#register-form").get_attribute("action")
    archive = tar_gz({"lib-one/SKILL.md": skill_md("lib-one")})
    server = FileServer().start()
    try:
        url = server.add("/lib.tar.gz", archive)
        with session_client(console.url, session_cookie(driver)) as c:
            for csrf in (None, "wrong"):
                extra = {} if csrf is None else {"csrf": csrf}
                answer = c.post(upload_action, data={"name": "lib", **extra},
                                files={"archive": ("lib.tar.gz", archive, "application/gzip")})
                assert answer.status_code == 403, ("upload", csrf, answer.status_code)
                answer = c.post(register_action, data={"name": "lib", "url": url, **extra})
                assert answer.status_code == 403, ("register", csrf, answer.status_code)
        assert server.hits.get("/lib.tar.gz") is None
        with console.api() as api:
            assert api.get("/v1/libraries").json() == []
    finally:
        server.stop()
