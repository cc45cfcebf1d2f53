"""Skill libraries and the operator page in the web console (issue #20), in Debian's Chromium driven by Selenium:
uploading versions of a library, making one current, a bad archive and a library by URL refused with the API's
reason (a 404, a private address); the operator page's queues, workers and runs per minute.

What the pages show is compared with the JSON API's answers for the same team; archives by URL are served by a local
``FileServer``.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.expected_conditions import staleness_of

from orchestrator.libraries import LibraryRegistry
from tests.console.conftest import (
    api_run,
    open_page,
    set_field,
    signed_in,
    texts,
    wait_for,
    wait_for_message,
    wait_for_path,
)
from tests.file_server import FileServer
from tests.orchestrator.api_helpers import new_team
from tests.orchestrator.test_api_teams import skill_md, tar_gz, zipped

pytestmark = pytest.mark.slow  # each test starts a server and Chromium: a few seconds apiece

NOT_AN_ARCHIVE = b"definitely not an archive\n" * 64


# ----------------------------------------------------------------------------------------------------------------
# Libraries


def _versions(driver: WebDriver, library: str) -> dict[str, object]:
    return {r.get_attribute("data-version"): r for r in driver.find_elements(
        By.CSS_SELECTOR, f'section.library[data-name="{library}"] table.versions tr.version')}


def _current(driver: WebDriver, library: str) -> list[str]:
    return [r.get_attribute("data-version") for r in driver.find_elements(
        By.CSS_SELECTOR, f'section.library[data-name="{library}"] table.versions tr.version.current')]


def _upload(driver: WebDriver, name: str, archive: Path) -> None:
    set_field(driver, "#upload-form input#upload-name", name)
    driver.find_element(By.CSS_SELECTOR, "#upload-form input#upload-archive").send_keys(str(archive))
    button = driver.find_element(By.CSS_SELECTOR, "#upload-form button#upload-submit")
    button.click()
    wait_for(driver, staleness_of(button), "the upload's answer page")  # not the last upload's notice


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
    assert "tools" in wait_for_message(driver, "#notice")
    assert list(_versions(driver, "tools")) == ["1"] and _current(driver, "tools") == ["1"]
    _upload(driver, "tools", v2)
    wait_for_message(driver, "#notice")
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
    assert refused.json()["detail"] in wait_for_message(driver, "#error")
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
        assert "HTTP 404" in wait_for_message(driver, "#error")
        assert not driver.find_elements(By.CSS_SELECTOR, 'section.library[data-name="fetched"]')
        open_page(driver, console, "/ui/libraries", "#register-form")
        set_field(driver, "#register-form input#register-name", "fetched")
        set_field(driver, "#register-form input#register-url", fetched)
        driver.find_element(By.CSS_SELECTOR, "#register-form button#register-submit").click()
        assert "fetched" in wait_for_message(driver, "#notice")
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
        assert "private or local address" in wait_for_message(driver, "#error")
        assert server.hits.get("/team.tar.gz") is None
        open_page(driver, console, "/ui/libraries", "#register-form")
        assert driver.find_elements(By.CSS_SELECTOR, "section.library") == []
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
