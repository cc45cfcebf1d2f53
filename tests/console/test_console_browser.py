"""The web console (issue #20) in a real browser: signing in and out, skills, runs from the run form followed live,
output files previewed and downloaded, libraries, the operator page, tenancy, and what the console must never let
through (scripts from skills or run output, requests without the form's CSRF token).

Each test serves the embedded default (inline runs on the local runtime) with teams ``team-a`` and ``team-b`` and
drives headless Chromium; what a browser cannot see (status codes, headers) is checked with httpx on the same server.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from orchestrator.libraries import LibraryRegistry
from tests.console.conftest import (
    RUN_PAGE,
    RUN_SECONDS,
    SESSION_COOKIE,
    Console,
    csp_violations,
    csrf_token,
    force_field,
    open_page,
    path_of,
    run_status,
    session_client,
    session_cookie,
    set_field,
    sign_in,
    submit_login,
    submit_run,
    texts,
    wait_for,
    wait_for_download,
    wait_for_path,
    wait_until_ended,
)
from tests.file_server import FileServer
from tests.orchestrator.api_helpers import new_team
from tests.orchestrator.test_api_teams import skill_md, tar_gz, zipped

pytestmark = pytest.mark.slow  # each test starts a server and Chromium: a few seconds apiece

FIB_10 = "".join(f"{n}\n" for n in (0, 1, 1, 2, 3, 5, 8, 13, 21, 34)).encode()
REPO_SKILLS = ["data-chart", "markdown-table", "pdf-report", "python-math", "spreadsheet", "user-file-ops",
               "weather-tools"]
NOT_AN_ARCHIVE = b"definitely not an archive\n" * 64


# ----------------------------------------------------------------------------------------------------------------
# Helpers


def upload_library(console: Console, team: str, name: str, archive: bytes, filename: str = "lib.tar.gz") -> dict:
    """A library version uploaded through the JSON API."""
    with console.api(team) as api:
        answer = api.post(f"/v1/libraries/{name}/upload", params={"filename": filename}, content=archive)
    assert answer.status_code == 201, answer.text
    return answer.json()


def api_run(console: Console, body: dict, team: str = "team-a", wait: bool = True) -> dict:
    """A run submitted through the JSON API (and, with ``wait``, ended)."""
    with console.api(team) as api:
        run = api.post("/v1/runs", json=body)
        assert run.status_code == 202, run.text
        if not wait:
            return run.json()
        done = api.get(f"/v1/runs/{run.json()['id']}", params={"wait": RUN_SECONDS}).json()
    assert done["status"] in {"finished", "failed", "cancelled"}, done
    return done


def runs_of(console: Console, team: str = "team-a") -> list[dict]:
    with console.api(team) as api:
        return api.get("/v1/runs").json()["data"]


def signed_in(browser, console: Console, team: str = "team-a") -> WebDriver:
    driver = browser()
    sign_in(driver, console.url, console.keys[team])
    return driver


def output_file_row(driver: WebDriver, name: str):
    rows = driver.find_elements(By.CSS_SELECTOR, f'table#files tr.output-file[data-name="{name}"]')
    assert len(rows) == 1, f"{len(rows)} rows for {name}: {texts(driver, 'table#files tr.output-file')}"
    return rows[0]


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
# 1. Signing in and out


def test_sign_in_with_a_key_a_wrong_key_is_refused_and_signing_out_forgets_the_session(console, browser):
    driver = browser()
    driver.get(console.url + "/ui")
    wait_for_path(driver, r"/ui/login")
    assert driver.find_elements(By.CSS_SELECTOR, "#login-form input[type='hidden'][name='csrf']"), \
        "the login form has no hidden csrf field"
    assert driver.find_element(By.CSS_SELECTOR, "#login-form input#key").get_attribute("name") == "key"

    for wrong in ("sr_000000000000_" + "x" * 43, "not a key at all"):
        submit_login(driver, console.url, wrong)
        error = wait_for(driver, lambda d: (d.find_elements(By.CSS_SELECTOR, "#error") or [None])[0], "#error")
        wait_for(driver, lambda d: error.text.strip(), "a message in #error")
        assert re.fullmatch(r"/ui/login(\?.*)?", path_of(driver)), path_of(driver)
        assert wrong not in driver.current_url
        driver.get(console.url + "/ui/skills")
        wait_for_path(driver, r"/ui/login(\?.*)?")

    sign_in(driver, console.url, console.keys["team-a"])
    assert console.keys["team-a"] not in driver.current_url
    cookie = driver.get_cookie(SESSION_COOKIE)
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui", cookie
    assert SESSION_COOKIE not in driver.execute_script("return document.cookie")
    assert console.keys["team-a"] not in cookie["value"], "the session cookie holds the API key itself"
    driver.get(console.url + "/ui")
    wait_for_path(driver, r"/ui/skills")

    for nav, path in (("runs", "/ui/runs"), ("libraries", "/ui/libraries"), ("operator", "/ui/operator"),
                      ("skills", "/ui/skills")):
        driver.find_element(By.CSS_SELECTOR, f"a#nav-{nav}").click()
        wait_for_path(driver, re.escape(path))
        assert driver.find_elements(By.CSS_SELECTOR, "button#sign-out"), f"no sign-out button on {path}"

    old = session_cookie(driver)
    with session_client(console.url, old) as c:
        assert c.get("/ui/skills").status_code == 200
    driver.find_element(By.CSS_SELECTOR, "button#sign-out").click()
    wait_for_path(driver, r"/ui/login(\?.*)?")
    driver.get(console.url + "/ui/skills")
    wait_for_path(driver, r"/ui/login(\?.*)?")
    with session_client(console.url, old) as c:
        replayed = c.get("/ui/skills")
    assert replayed.status_code in (302, 303, 307) and replayed.headers["location"].endswith("/ui/login"), \
        (replayed.status_code, replayed.headers.get("location"))


def test_a_revoked_key_ends_its_console_sessions(console, browser):
    driver = signed_in(browser, console)
    other = signed_in(browser, console, "team-b")
    console.services.teams.revoke_key(console.keys["team-a"].split("_")[1])
    driver.get(console.url + "/ui/runs")
    wait_for_path(driver, r"/ui/login(\?.*)?")
    submit_login(driver, console.url, console.keys["team-a"])
    assert "revoked" in _message(driver, "#error") or "not valid" in _message(driver, "#error")
    other.get(console.url + "/ui/runs")
    wait_for_path(other, r"/ui/runs")


def test_every_console_page_redirects_to_the_login_page_when_signed_out(console):
    pages = ["/ui", "/ui/skills", "/ui/skills?q=math", "/ui/skills/python-math",
             "/ui/skills/weather-tools/docs/API_REFERENCE.md", "/ui/runs", "/ui/runs?status=finished",
             "/ui/runs/r0000", "/ui/runs/r0000/events", "/ui/runs/r0000/files/out/x.txt", "/ui/libraries",
             "/ui/operator"]
    for cookie in (None, "forged-session-value"):
        with session_client(console.url, cookie) as c:
            for page in pages:
                answer = c.get(page)
                assert answer.status_code == 303, (cookie, page, answer.status_code)
                assert answer.headers["location"].endswith("/ui/login"), (page, answer.headers["location"])
            assert c.get("/ui/login").status_code == 200


def test_every_page_sends_a_strict_content_security_policy_and_runs_no_inline_script(console, browser):
    run = api_run(console, {"skill": "python-math", "command": "python3 scripts/fib.py 3 > out/f.txt",
                            "output_files": ["out/f.txt"]})
    driver = browser()
    driver.get(console.url + "/ui/login")
    pages = ["/ui/login"]
    sign_in(driver, console.url, console.keys["team-a"])
    pages += ["/ui/skills", "/ui/skills/python-math", "/ui/skills/weather-tools/docs/API_REFERENCE.md", "/ui/runs",
              f"/ui/runs/{run['id']}", "/ui/libraries", "/ui/operator"]
    with session_client(console.url, session_cookie(driver)) as c:
        answers = [(page, c.get(page)) for page in pages]
        assert [(page, a.status_code) for page, a in answers] == [(page, 200) for page in pages]
        answers += [(page, c.get(page)) for page in ("/ui/skills/no-such-skill", "/ui/runs/r0000")]  # error pages
        answers.append(("POST /ui/login", c.post("/ui/login", data={"key": "wrong", "csrf": "wrong"})))
        for page, answer in answers:
            policy = answer.headers.get("content-security-policy", "")
            directives = {d.split()[0]: d.split()[1:] for d in policy.split(";") if d.strip()}
            assert directives.get("default-src") == ["'none'"], (page, policy)
            assert directives.get("script-src") == ["'self'"], (page, policy)
            assert answer.headers.get("x-content-type-options") == "nosniff", (page, dict(answer.headers))
    csp_violations(driver)  # forget the login's
    for page in pages[1:]:
        driver.get(console.url + page)
        wait_for(driver, lambda d: d.execute_script("return document.readyState") == "complete", f"{page} loaded")
        inline = driver.execute_script(
            "return [...document.scripts].filter(s => !s.src || new URL(s.src).origin !== location.origin)"
            ".map(s => s.outerHTML.slice(0, 200))")
        assert inline == [], (page, inline)
        handlers = driver.execute_script(
            "return [...document.querySelectorAll('*')].flatMap(e => [...e.attributes]"
            ".filter(a => a.name.startsWith('on')).map(a => e.tagName + '[' + a.name + ']'))")
        assert handlers == [], (page, handlers)
        time.sleep(0.3)  # a live page's event stream connects
        assert csp_violations(driver) == [], page


# ----------------------------------------------------------------------------------------------------------------
# 2. Skills


def test_skills_overview_search_a_skill_page_its_docs_and_tools(console, browser):
    driver = signed_in(browser, console)
    rows = driver.find_elements(By.CSS_SELECTOR, "table#skills tr.skill")
    assert [r.find_element(By.CSS_SELECTOR, "a.skill-name").text for r in rows] == REPO_SKILLS
    math = next(r for r in rows if r.find_element(By.CSS_SELECTOR, "a.skill-name").text == "python-math")
    assert math.find_element(By.CSS_SELECTOR, "a.skill-name").get_attribute("href") == \
        f"{console.url}/ui/skills/python-math"
    assert math.find_element(By.CSS_SELECTOR, "td.skill-description").text == \
        "Small Python utilities for math and text files."

    set_field(driver, "#search-form input#q", "fibonacci math")
    driver.find_element(By.CSS_SELECTOR, "#search-form input#q").send_keys(Keys.ENTER)
    wait_for_path(driver, r"/ui/skills\?(.*&)?q=fibonacci(\+|%20)math(&.*)?")
    found = texts(driver, "table#skills tr.skill a.skill-name")
    assert "python-math" in found and "weather-tools" not in found, found
    assert driver.find_element(By.CSS_SELECTOR, "#search-form input#q").get_attribute("value") == "fibonacci math"
    driver.get(console.url + "/ui/skills?q=nothing-matches-this-zzz")
    assert texts(driver, "table#skills tr.skill") == []

    driver.get(console.url + "/ui/skills?q=math")
    driver.find_element(By.CSS_SELECTOR, "table#skills a.skill-name[href='/ui/skills/python-math']").click()
    wait_for_path(driver, r"/ui/skills/python-math")
    assert "python-math" in driver.find_element(By.TAG_NAME, "h1").text
    body = driver.find_element(By.CSS_SELECTOR, "#skill-body")
    headings = [h.text for h in body.find_elements(By.CSS_SELECTOR, "h1, h2, h3")]
    assert "Python Math" in headings and "Overview" in headings, headings
    assert body.find_elements(By.CSS_SELECTOR, "code"), "inline code of the body is not rendered"
    assert "## Overview" not in body.text and "---" not in body.text.splitlines()[:1]
    assert "description: Small Python" not in body.text, "the front matter is shown as the body"
    assert [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#docs a.doc")] == ["USAGE.md"]
    runtimes = Select(driver.find_element(By.CSS_SELECTOR, "#run-form select#runtime"))
    assert [o.get_attribute("value") for o in runtimes.options] == ["local", "docker", "cube"]
    assert driver.find_element(By.CSS_SELECTOR, "#run-form textarea#output-files").get_attribute("name") == \
        "output_files"
    environments = driver.find_elements(By.CSS_SELECTOR, "#environments tr.environment")
    assert environments and all(e.get_attribute("data-runtime") and e.get_attribute("data-state")
                                for e in environments), [e.get_attribute("outerHTML") for e in environments]
    assert "local" in [e.get_attribute("data-runtime") for e in environments]
    assert driver.find_elements(By.CSS_SELECTOR, "#problems")
    assert texts(driver, "#problems li.problem") == []

    open_page(driver, console, "/ui/skills/weather-tools", "#tools")
    assert texts(driver, "#tools li.tool") == ["get_current_weather", "get_weather_forecast", "search_city_by_name"]
    doc = driver.find_element(By.CSS_SELECTOR, "#docs a.doc")
    assert doc.text == "API_REFERENCE.md"
    assert doc.get_attribute("href") == f"{console.url}/ui/skills/weather-tools/docs/API_REFERENCE.md"
    doc.click()
    wait_for_path(driver, r"/ui/skills/weather-tools/docs/API_REFERENCE\.md")
    doc_body = driver.find_element(By.CSS_SELECTOR, "#doc-body")
    assert doc_body.find_elements(By.CSS_SELECTOR, "h1, h2, h3"), doc_body.get_attribute("innerHTML")[:500]
    assert not doc_body.text.lstrip().startswith("#")

    with session_client(console.url, session_cookie(driver)) as c:
        assert c.get("/ui/skills/no-such-skill").status_code == 404
        assert c.get("/ui/skills/weather-tools/docs/NOPE.md").status_code == 404
        assert c.get("/ui/skills/weather-tools/docs/..%2FSKILL.md").status_code == 404
        assert c.get("/ui/skills/weather-tools/docs/scripts%2Fforecast.py").status_code == 404


# ----------------------------------------------------------------------------------------------------------------
# 3. Runs from the run form


def test_a_run_from_its_skill_page_shows_its_output_previews_and_downloads_its_file(console, browser):
    driver = signed_in(browser, console)
    run_id = submit_run(driver, console, "python-math", "python3 scripts/fib.py 10 | tee out/fib.txt",
                        output_files=("out/fib.txt",))
    assert wait_until_ended(driver) == "finished"
    assert driver.find_element(By.CSS_SELECTOR, "pre#stdout").text.split() == FIB_10.decode().split()
    assert driver.find_element(By.CSS_SELECTOR, "pre#stderr").text == ""
    events = [e.get_attribute("data-type") for e in driver.find_elements(By.CSS_SELECTOR, "#events li.event")]
    assert {"queued", "started", "finished"} <= set(events), events
    assert events.index("queued") < events.index("started") < events.index("finished"), events
    assert driver.find_elements(By.CSS_SELECTOR, "table#timings tr"), "no timings"
    assert not driver.find_elements(By.CSS_SELECTOR, "button#cancel"), "a cancel button on an ended run"

    row = output_file_row(driver, "out/fib.txt")
    assert re.search(rf"\b{len(FIB_10)}\b", row.find_element(By.CSS_SELECTOR, "td.file-size").text), row.text
    assert "text/plain" in row.find_element(By.CSS_SELECTOR, "td.file-mime").text
    link = row.find_element(By.CSS_SELECTOR, "a.download")
    assert link.get_attribute("href") == f"{console.url}/ui/runs/{run_id}/files/out/fib.txt"
    previews = driver.find_elements(By.CSS_SELECTOR, "pre.preview")
    assert [p.text.split() for p in previews] == [FIB_10.decode().split()], [p.text for p in previews]

    with console.api() as api:
        run = api.get(f"/v1/runs/{run_id}").json()
        served = api.get(f"/v1/runs/{run_id}/files/out/fib.txt").content
    assert run["status"] == "finished" and run["skill"] == "python-math" and served == FIB_10
    with session_client(console.url, session_cookie(driver)) as c:
        download = c.get(f"/ui/runs/{run_id}/files/out/fib.txt")
    assert download.status_code == 200 and download.content == FIB_10
    assert download.headers["content-type"].startswith("text/plain")
    assert download.headers["x-content-type-options"] == "nosniff"

    page = driver.current_url
    link.click()
    downloaded = wait_for_download(driver.downloads)
    assert downloaded.read_bytes() == FIB_10
    assert downloaded.read_bytes().decode().split() == previews[0].text.split()
    assert driver.current_url == page, "the download link navigated away instead of downloading"


def test_the_run_form_passes_environment_runtime_and_timeout(console, browser):
    driver = signed_in(browser, console)
    run_id = submit_run(driver, console, "python-math", 'echo "greeting=$GREETING other=$OTHER"; sleep 20',
                        env=("GREETING=hello there", "OTHER=a=b"), runtime="local", timeout="2")
    started = time.monotonic()
    assert wait_until_ended(driver) == "finished"
    assert time.monotonic() - started < 15, "the 2 s timeout was not applied"
    assert driver.find_element(By.CSS_SELECTOR, "pre#stdout").text.strip() == "greeting=hello there other=a=b"
    with console.api() as api:
        run = api.get(f"/v1/runs/{run_id}").json()
    assert run["runtime"] == "local" and run["result"]["timed_out"] is True, run


@pytest.mark.parametrize(("field", "value", "message"), [
    ("command", "", "command"),
    ("timeout", "abc", "timeout"),
    ("env", "NO_EQUALS_SIGN", "NO_EQUALS_SIGN"),
    ("output-files", "../../etc/passwd", ""),
])
def test_bad_run_input_shows_the_error_on_the_skill_page_and_creates_no_run(console, browser, field, value, message):
    driver = signed_in(browser, console)
    open_page(driver, console, "/ui/skills/python-math", "#run-form")
    set_field(driver, "#run-form input#command", "echo hi")
    selector = {"command": "input#command", "timeout": "input#timeout", "env": "textarea#env",
                "output-files": "textarea#output-files"}[field]
    force_field(driver, f"#run-form {selector}", value)
    driver.find_element(By.CSS_SELECTOR, "#run-form button#run-submit").click()
    error = wait_for(driver, lambda d: (d.find_elements(By.CSS_SELECTOR, "#error") or [None])[0], "#error")
    wait_for(driver, lambda d: error.text.strip(), "a message in #error")
    assert message.lower() in error.text.lower(), error.text
    assert re.fullmatch(r"/ui/skills/python-math(/run)?(\?.*)?", path_of(driver)), path_of(driver)
    assert driver.find_elements(By.CSS_SELECTOR, "#run-form"), "the skill page (with its form) is not shown again"
    assert runs_of(console) == []


def test_the_run_page_follows_a_running_run_live_and_cancels_it(console, browser):
    driver = signed_in(browser, console)
    submit_run(driver, console, "python-math", "sleep 3; echo done")
    status, ended = run_status(driver)
    assert status in {"queued", "started"} and ended != "true", (status, ended)
    assert driver.find_elements(By.CSS_SELECTOR, "button#cancel")
    assert wait_until_ended(driver) == "finished"
    assert driver.find_element(By.CSS_SELECTOR, "pre#stdout").text.strip() == "done"
    assert csp_violations(driver) == []

    run_id = submit_run(driver, console, "python-math", "sleep 50; echo not cancelled")
    wait_for(driver, lambda d: run_status(d)[0] == "started", "the run to start")
    driver.find_element(By.CSS_SELECTOR, "button#cancel").click()
    assert wait_until_ended(driver) == "cancelled"
    assert "not cancelled" not in driver.find_element(By.CSS_SELECTOR, "pre#stdout").text
    assert not driver.find_elements(By.CSS_SELECTOR, "button#cancel")
    with console.api() as api:
        assert api.get(f"/v1/runs/{run_id}").json()["status"] == "cancelled"
    assert csp_violations(driver) == []


# ----------------------------------------------------------------------------------------------------------------
# 4. The runs list


def test_the_runs_list_shows_the_team_s_runs_and_filters_by_status_and_skill(console, browser):
    fib = api_run(console, {"skill": "python-math", "command": "python3 scripts/fib.py 3"})
    weather = api_run(console, {"skill": "weather-tools", "command": "true"})
    slow = api_run(console, {"skill": "python-math", "command": "sleep 50"}, wait=False)
    with console.api() as api:
        assert api.post(f"/v1/runs/{slow['id']}/cancel").status_code == 200
        assert api.get(f"/v1/runs/{slow['id']}", params={"wait": 30}).json()["status"] == "cancelled"

    driver = signed_in(browser, console)
    driver.find_element(By.CSS_SELECTOR, "a#nav-runs").click()
    wait_for_path(driver, r"/ui/runs")
    rows = {r.get_attribute("data-run-id"): r for r in driver.find_elements(By.CSS_SELECTOR, "table#runs tr.run")}
    assert set(rows) == {fib["id"], weather["id"], slow["id"]}
    for run, skill, status in ((fib, "python-math", "finished"), (weather, "weather-tools", "finished"),
                               (slow, "python-math", "cancelled")):
        row = rows[run["id"]]
        assert row.get_attribute("data-status") == status
        assert row.find_element(By.CSS_SELECTOR, "td.run-skill").text == skill
        assert status in row.find_element(By.CSS_SELECTOR, "td.run-status").text
        assert row.find_element(By.CSS_SELECTOR, "a.run-link").get_attribute("href") == \
            f"{console.url}/ui/runs/{run['id']}"
        assert row.find_element(By.CSS_SELECTOR, "td.run-created").text.strip()
        row.find_element(By.CSS_SELECTOR, "td.run-worker")
    assert re.search(r"\d", rows[fib["id"]].find_element(By.CSS_SELECTOR, "td.run-duration").text)

    Select(driver.find_element(By.CSS_SELECTOR, "#runs-filter select#status")).select_by_value("finished")
    set_field(driver, "#runs-filter input#skill", "python-math")
    driver.find_element(By.CSS_SELECTOR, "#runs-filter input#skill").send_keys(Keys.ENTER)
    wait_for(driver, lambda d: "skill=python-math" in d.current_url and "status=finished" in d.current_url,
             "the filter in the URL")
    assert [r.get_attribute("data-run-id") for r in driver.find_elements(By.CSS_SELECTOR, "table#runs tr.run")] == \
        [fib["id"]]
    assert Select(driver.find_element(By.CSS_SELECTOR, "#runs-filter select#status")).first_selected_option \
        .get_attribute("value") == "finished"

    driver.get(console.url + "/ui/runs?status=cancelled")
    assert [r.get_attribute("data-run-id") for r in driver.find_elements(By.CSS_SELECTOR, "table#runs tr.run")] == \
        [slow["id"]]
    driver.get(console.url + "/ui/runs?skill=weather-tools")
    assert [r.get_attribute("data-run-id") for r in driver.find_elements(By.CSS_SELECTOR, "table#runs tr.run")] == \
        [weather["id"]]
    driver.get(console.url + "/ui/runs?status=finished&skill=python-math")
    driver.find_element(By.CSS_SELECTOR, f"tr.run[data-run-id='{fib['id']}'] a.run-link").click()
    wait_for_path(driver, re.escape(f"/ui/runs/{fib['id']}"))
    assert run_status(driver) == ("finished", "true")
    with session_client(console.url, session_cookie(driver)) as c:
        assert c.get("/ui/runs?status=no-such-status").status_code in (200, 400, 422)


# ----------------------------------------------------------------------------------------------------------------
# 5. Libraries


def _versions(driver: WebDriver, library: str) -> dict[str, object]:
    return {r.get_attribute("data-version"): r for r in driver.find_elements(
        By.CSS_SELECTOR, f'section.library[data-name="{library}"] table.versions tr.version')}


def _current(driver: WebDriver, library: str) -> list[str]:
    return [r.get_attribute("data-version") for r in driver.find_elements(
        By.CSS_SELECTOR, f'section.library[data-name="{library}"] table.versions tr.version.current')]


def _upload(driver: WebDriver, name: str, archive: Path) -> None:
    set_field(driver, "#upload-form input#upload-name", name)
    driver.find_element(By.CSS_SELECTOR, "#upload-form input#upload-archive").send_keys(str(archive))
    driver.find_element(By.CSS_SELECTOR, "#upload-form button#upload-submit").click()


def _message(driver: WebDriver, css: str) -> str:
    element = wait_for(driver, lambda d: (d.find_elements(By.CSS_SELECTOR, css) or [None])[0], css)
    return wait_for(driver, lambda d: element.text.strip(), f"a message in {css}")


def test_libraries_upload_two_versions_make_one_current_and_refuse_a_bad_archive(console, browser, tmp_path):
    v1 = tmp_path / "tools-v1.tar.gz"
    v1.write_bytes(tar_gz({"lib-one/SKILL.md": skill_md("lib-one"), "lib-one/scripts/go.sh": b"echo one\n"}))
    v2 = tmp_path / "tools-v2.zip"
    v2.write_bytes(zipped({"lib-one/SKILL.md": skill_md("lib-one"), "lib-one/scripts/go.sh": b"echo two\n",
                           "lib-two/SKILL.md": skill_md("lib-two")}))
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(NOT_AN_ARCHIVE)

    driver = signed_in(browser, console)
    open_page(driver, console, "/ui/libraries", "#upload-form")
    assert driver.find_elements(By.CSS_SELECTOR, "section.library") == []
    assert driver.find_element(By.CSS_SELECTOR, "#upload-form").get_attribute("enctype") == "multipart/form-data"

    _upload(driver, "tools", v1)
    assert "tools" in _message(driver, "#notice")
    assert list(_versions(driver, "tools")) == ["1"] and _current(driver, "tools") == ["1"]
    _upload(driver, "tools", v2)
    _message(driver, "#notice")
    wait_for(driver, lambda d: len(_versions(d, "tools")) == 2, "two versions")
    assert _current(driver, "tools") == ["2"]

    with console.api() as api:
        library = api.get("/v1/libraries/tools").json()
    by_version = {str(v["version"]): v for v in library["versions"]}
    rows = _versions(driver, "tools")
    for version, row in rows.items():
        digest = row.find_element(By.CSS_SELECTOR, "td.digest").text.strip().rstrip("…").rstrip(".")
        assert len(digest) >= 8 and by_version[version]["sha256"].startswith(digest), (digest, by_version[version])
        assert re.search(r"\d", row.find_element(By.CSS_SELECTOR, "td.size").text)
        assert row.find_element(By.CSS_SELECTOR, "td.skill-count").text.strip() == \
            str(by_version[version]["skill_count"])
        assert row.find_element(By.CSS_SELECTOR, "td.created").text.strip()
    assert rows["1"].find_element(By.CSS_SELECTOR, "td.skill-count").text.strip() == "1"
    assert rows["2"].find_element(By.CSS_SELECTOR, "td.skill-count").text.strip() == "2"
    assert rows["1"].find_elements(By.CSS_SELECTOR, "button.make-current")
    assert not rows["2"].find_elements(By.CSS_SELECTOR, "button.make-current"), "the current version can be made current"

    driver.find_element(By.CSS_SELECTOR, "a#nav-skills").click()
    wait_for_path(driver, r"/ui/skills")
    assert texts(driver, "table#skills a.skill-name") == ["lib-one", "lib-two"]

    open_page(driver, console, "/ui/libraries", "section.library")
    _versions(driver, "tools")["1"].find_element(By.CSS_SELECTOR, "button.make-current").click()
    wait_for(driver, lambda d: _current(d, "tools") == ["1"], "version 1 to be current")
    assert _versions(driver, "tools")["2"].find_elements(By.CSS_SELECTOR, "button.make-current")
    with console.api() as api:
        assert api.get("/v1/libraries/tools").json()["current"] == 1
    driver.find_element(By.CSS_SELECTOR, "a#nav-skills").click()
    wait_for_path(driver, r"/ui/skills")
    assert texts(driver, "table#skills a.skill-name") == ["lib-one"]

    # The API's own refusal of the same bytes (asked for another team, which keeps nothing of it).
    scratch = new_team(console.services, "team-scratch")
    with httpx.Client(base_url=console.url, headers={"Authorization": f"Bearer {scratch}"}, trust_env=False) as api:
        refused = api.post("/v1/libraries/tools/upload", params={"filename": "bad.tar.gz"}, content=NOT_AN_ARCHIVE)
    assert refused.status_code == 422
    open_page(driver, console, "/ui/libraries", "#upload-form")
    _upload(driver, "tools", bad)
    assert refused.json()["detail"] in _message(driver, "#error")
    assert not driver.find_elements(By.CSS_SELECTOR, "#notice") or not driver.find_element(
        By.CSS_SELECTOR, "#notice").text.strip()
    open_page(driver, console, "/ui/libraries", "section.library")
    assert sorted(_versions(driver, "tools")) == ["1", "2"] and _current(driver, "tools") == ["1"]
    with console.api() as api:
        assert [v["version"] for v in api.get("/v1/libraries/tools").json()["versions"]] == [1, 2]

    # By URL: a 404 is refused with the API's reason; an archive there becomes a library.
    server = FileServer().start()
    try:
        fetched = server.add("/fetched.tar.gz", tar_gz({"url-skill/SKILL.md": skill_md("url-skill")}))
        missing = server.add("/missing.tar.gz", b"", status=404)
        set_field(driver, "#register-form input#register-name", "fetched")
        set_field(driver, "#register-form input#register-url", missing)
        driver.find_element(By.CSS_SELECTOR, "#register-form button#register-submit").click()
        assert "HTTP 404" in _message(driver, "#error")
        assert not driver.find_elements(By.CSS_SELECTOR, 'section.library[data-name="fetched"]')
        open_page(driver, console, "/ui/libraries", "#register-form")
        set_field(driver, "#register-form input#register-name", "fetched")
        set_field(driver, "#register-form input#register-url", fetched)
        driver.find_element(By.CSS_SELECTOR, "#register-form button#register-submit").click()
        assert "fetched" in _message(driver, "#notice")
        wait_for(driver, lambda d: _current(d, "fetched") == ["1"], "the fetched library")
    finally:
        server.stop()


def test_registering_a_library_url_on_a_private_address_shows_the_refusal(console, browser, tmp_path):
    # The tests' services allow private addresses; the default registry (production's) refuses them.
    console.services.libraries = LibraryRegistry(console.services.teams.docs, tmp_path / "libraries")
    server = FileServer().start()
    try:
        url = server.add("/team.tar.gz", tar_gz({"x/SKILL.md": skill_md("x")}))
        driver = signed_in(browser, console)
        open_page(driver, console, "/ui/libraries", "#register-form")
        set_field(driver, "#register-form input#register-name", "main")
        set_field(driver, "#register-form input#register-url", url)
        driver.find_element(By.CSS_SELECTOR, "#register-form button#register-submit").click()
        assert "private or local address" in _message(driver, "#error")
        assert server.hits.get("/team.tar.gz") is None
        open_page(driver, console, "/ui/libraries", "#register-form")
        assert driver.find_elements(By.CSS_SELECTOR, "section.library") == []
    finally:
        server.stop()


# ----------------------------------------------------------------------------------------------------------------
# 6. Tenancy


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
# 7. Nothing a skill or a run wrote runs in the console


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
# 8. CSRF


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


# ----------------------------------------------------------------------------------------------------------------
# The operator page


def test_the_operator_page_shows_queues_workers_and_runs_per_minute(console, browser):
    ended = [api_run(console, {"skill": "python-math", "command": "true"}),
             api_run(console, {"skill": "python-math", "command": "exit 3"}, team="team-b")]
    driver = signed_in(browser, console)
    driver.find_element(By.CSS_SELECTOR, "a#nav-operator").click()
    wait_for_path(driver, r"/ui/operator")
    # The embedded default runs inline: it may show no queue and no worker; rows it shows are well formed.
    driver.find_element(By.CSS_SELECTOR, "table#queues")
    for queue in driver.find_elements(By.CSS_SELECTOR, "table#queues tr.queue"):
        assert queue.get_attribute("data-runtime")
        assert re.fullmatch(r"\d+", queue.find_element(By.CSS_SELECTOR, "td.depth").text.strip()), queue.text
    driver.find_element(By.CSS_SELECTOR, "table#workers")
    for worker in driver.find_elements(By.CSS_SELECTOR, "table#workers tr.worker"):
        assert worker.find_element(By.CSS_SELECTOR, "td.worker-heartbeat").text.strip()
    minutes = driver.find_elements(By.CSS_SELECTOR, "#throughput tr.minute")
    assert minutes, driver.find_element(By.CSS_SELECTOR, "#throughput").get_attribute("outerHTML")[:500]

    def total(css: str) -> int:
        return sum(int(m.find_element(By.CSS_SELECTOR, css).text) for m in minutes)

    assert (total("td.ended"), total("td.failed")) == (2, 1), [m.text for m in minutes]
    assert not any(run["id"] in driver.page_source for run in ended), "the operator page names runs"
