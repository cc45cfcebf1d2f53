"""Skills and runs in the web console (issue #20), in Debian's Chromium driven by Selenium: the skills overview and
its search, a skill's page, docs and tools; runs sent from a skill's run form (environment, runtime, timeout, bad
input), followed live on the run page and cancelled there, their output files previewed and downloaded; the runs
list and its filters.

Runs execute inline on the local runtime of the embedded default (``conftest.py``); the JSON API is asked what a run
ended as, and httpx fetches a file the browser downloaded to compare its bytes and headers.
"""

from __future__ import annotations

import re
import time

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from tests.console.conftest import (
    REPO_SKILLS,
    api_run,
    csp_violations,
    force_field,
    open_page,
    output_file_row,
    path_of,
    run_status,
    runs_of,
    session_client,
    session_cookie,
    set_field,
    signed_in,
    submit_run,
    texts,
    wait_for,
    wait_for_download,
    wait_for_path,
    wait_until_ended,
)

pytestmark = pytest.mark.slow  # each test starts a server and Chromium: a few seconds apiece

FIB_10 = "".join(f"{n}\n" for n in (0, 1, 1, 2, 3, 5, 8, 13, 21, 34)).encode()


# ----------------------------------------------------------------------------------------------------------------
# Skills


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
# Runs from the run form


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
# The runs list


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
