"""The web console in a real browser: Debian's Chromium driven by Selenium against the API served on loopback.

``console`` serves the embedded default (inline runs on the local runtime, the repo's ``skills/`` library) with two
teams, ``team-a`` and ``team-b``, each with a key; ``browser()`` opens a fresh headless Chromium (its own profile and
download folder) that is always quit in teardown. Selenium cannot read response headers or status codes: tests check
those with httpx against the same server, with the browser's session cookie (``session_client``).
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from orchestrator.services import Services
from tests.conftest import EXAMPLE_SKILLS
from tests.orchestrator.api_helpers import api_in_a_thread, new_team
from tests.services import ensure_installed

SESSION_COOKIE = "skillrun_session"
CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1280,900",
)
PAGE_LOAD_SECONDS = 30
WAIT_SECONDS = 15
"""How long a test waits for a page to show something (a redirect, a message) before failing."""
RUN_SECONDS = 60
"""How long a test waits for a run page to show the run ended."""
RUN_PAGE = r"/ui/runs/([A-Za-z0-9_-]+)"
REPO_SKILLS = EXAMPLE_SKILLS
"""The skills of the repo's ``skills/`` library (which the embedded default serves), as the console lists them."""


def chromium_binaries() -> tuple[str, str]:
    """Debian's Chromium and its driver, installed if missing (as root), else a skip (outside CI) or a failure."""
    chromium = ensure_installed("chromium", "chromium")
    chromedriver = ensure_installed("chromedriver", "chromium-driver")
    return chromium, chromedriver


def start_chromium(profile: Path, downloads: Path, binaries: tuple[str, str] | None = None) -> WebDriver:
    """A headless Chromium with a fresh profile that saves downloads into ``downloads`` without asking."""
    chromium, chromedriver = binaries or chromium_binaries()
    profile.mkdir(parents=True, exist_ok=True)
    downloads.mkdir(parents=True, exist_ok=True)
    options = Options()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_experimental_option("prefs", {
        "download.default_directory": str(downloads), "download.prompt_for_download": False,
        "download.directory_upgrade": True, "safebrowsing.enabled": False,
    })
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    try:
        driver.set_page_load_timeout(PAGE_LOAD_SECONDS)
        driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    except BaseException:
        driver.quit()
        raise
    driver.downloads = downloads  # where this browser's downloads land
    return driver


# ----------------------------------------------------------------------------------------------------------------
# Reading pages


def path_of(driver: WebDriver) -> str:
    """The current URL's path (and query), without scheme and host."""
    return re.sub(r"^[a-z]+://[^/]+", "", driver.current_url)


DETACHED = "does not belong to the document"


def wait_for(driver: WebDriver, condition: Callable[[WebDriver], object], what: str, seconds: float = WAIT_SECONDS):
    """``condition``'s first truthy answer; elements that go stale (a page reloading itself) are looked up again.
    On timeout the failure says ``what`` was awaited and shows where the browser is and the page's text."""
    def attempt(d: WebDriver) -> object:
        try:
            return condition(d)
        except WebDriverException as exc:  # Chrome's other word for a stale element: a node a re-render replaced
            if DETACHED not in (exc.msg or ""):
                raise
            return False

    try:
        return WebDriverWait(driver, seconds, poll_frequency=0.1,
                             ignored_exceptions=(StaleElementReferenceException,)).until(attempt)
    except TimeoutException:
        try:
            text = driver.find_element(By.TAG_NAME, "body").text[:2000]
        except Exception:  # noqa: BLE001 - only for the message
            text = "(no body)"
        raise AssertionError(f"waited {seconds}s for {what}; at {driver.current_url}:\n{text}") from None


def wait_for_path(driver: WebDriver, pattern: str, seconds: float = WAIT_SECONDS) -> str:
    """Wait until the URL's path matches the regular expression ``pattern`` (in full); the path."""
    wait_for(driver, lambda d: re.fullmatch(pattern, path_of(d)), f"the URL path to match {pattern!r}", seconds)
    return path_of(driver)


def wait_for_message(driver: WebDriver, css: str) -> str:
    """The text of the element at ``css`` (``#error``, ``#notice``) once it is there and not empty."""
    def message(d: WebDriver) -> str | None:  # looked up at each poll: a page that reloads holds a new element
        found = d.find_elements(By.CSS_SELECTOR, css)
        return found[0].text.strip() if found else None

    return wait_for(driver, message, f"a message in {css}")


def texts(driver: WebDriver, css: str) -> list[str]:
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, css)]


def csp_violations(driver: WebDriver) -> list[str]:
    """The Content-Security-Policy violations the browser reported since last asked (a page that relies on inline
    scripts or styles the policy blocks shows up here)."""
    return [entry["message"] for entry in driver.get_log("browser") if "Content Security Policy" in entry["message"]]


def set_field(driver: WebDriver, css: str, value: str) -> None:
    """Type ``value`` into the field (input, textarea) at ``css``, replacing what it held."""
    element = driver.find_element(By.CSS_SELECTOR, css)
    element.clear()
    if value:
        element.send_keys(value)


def force_field(driver: WebDriver, css: str, value: str) -> None:
    """Put ``value`` into a field whatever the browser's own checks say (``required``, ``type=number``, ``pattern``
    are removed first), so that the server's validation is what is tested."""
    element = driver.find_element(By.CSS_SELECTOR, css)
    driver.execute_script(
        "const e = arguments[0];"
        "for (const a of ['required', 'pattern', 'min', 'max', 'minlength', 'maxlength', 'step']) e.removeAttribute(a);"
        "if (e.tagName === 'INPUT' && e.type !== 'file') e.type = 'text';"
        "e.value = arguments[1];"
        "if (e.form) e.form.noValidate = true;",
        element, value)


# ----------------------------------------------------------------------------------------------------------------
# Signing in


def sign_in(driver: WebDriver, base_url: str, key: str) -> None:
    """Sign in on the login page with ``key`` and wait for the skills overview the console lands on."""
    submit_login(driver, base_url, key)
    wait_for_path(driver, r"/ui/skills")


def signed_in(browser, console: Console, team: str = "team-a") -> WebDriver:
    driver = browser()
    sign_in(driver, console.url, console.keys[team])
    return driver


def submit_login(driver: WebDriver, base_url: str, key: str) -> None:
    """Fill in and send the login form, without waiting for where it leads."""
    driver.get(f"{base_url}/ui/login")
    field_ = wait_for(driver, lambda d: d.find_element(By.CSS_SELECTOR, "#login-form input#key"), "the login form")
    field_.clear()
    field_.send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "#login-form button#sign-in").click()


def session_cookie(driver: WebDriver) -> str:
    """The value of the browser's console session cookie (HttpOnly: scripts cannot read it, WebDriver can)."""
    cookie = driver.get_cookie(SESSION_COOKIE)
    assert cookie is not None, f"no {SESSION_COOKIE} cookie; the browser has {[c['name'] for c in driver.get_cookies()]}"
    return cookie["value"]


def session_client(base_url: str, cookie: str | None) -> httpx.Client:
    """An httpx client that sends ``cookie`` as the console's session cookie and does not follow redirects."""
    headers = {"Cookie": f"{SESSION_COOKIE}={cookie}"} if cookie else {}
    return httpx.Client(base_url=base_url, headers=headers, follow_redirects=False, timeout=30, trust_env=False)


def api_client(base_url: str, key: str) -> httpx.Client:
    """An httpx client of the JSON API with a team's key."""
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60, trust_env=False)


def csrf_token(driver: WebDriver, form: str = "") -> str:
    """The CSRF token of a form (``form`` a CSS selector) on the page the browser shows."""
    field_ = driver.find_element(By.CSS_SELECTOR, f"{form} input[name='csrf']".strip())
    token = field_.get_attribute("value")
    assert token, f"the form {form or '(first)'} has an empty csrf field"
    return token


# ----------------------------------------------------------------------------------------------------------------
# Runs


def open_page(driver: WebDriver, console: Console, path: str, ready: str) -> None:
    """Open ``path`` and wait for the element ``ready`` (CSS) to be there."""
    driver.get(console.url + path)
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ready), f"{ready} on {path}")


def submit_run(driver: WebDriver, console: Console, skill: str, command: str, output_files: tuple[str, ...] = (),
               env: tuple[str, ...] = (), runtime: str | None = None, timeout: str | None = None) -> str:
    """Fill in the run form of ``skill``'s page, send it, and wait for the run page; the run's id."""
    open_page(driver, console, f"/ui/skills/{skill}", "#run-form")
    set_field(driver, "#run-form input#command", command)
    set_field(driver, "#run-form textarea#output-files", "\n".join(output_files))
    set_field(driver, "#run-form textarea#env", "\n".join(env))
    if runtime:
        Select(driver.find_element(By.CSS_SELECTOR, "#run-form select#runtime")).select_by_value(runtime)
    if timeout:
        set_field(driver, "#run-form input#timeout", timeout)
    driver.find_element(By.CSS_SELECTOR, "#run-form button#run-submit").click()
    path = wait_for_path(driver, RUN_PAGE)
    return re.fullmatch(RUN_PAGE, path).group(1)


def run_status(driver: WebDriver) -> tuple[str | None, str | None]:
    """``#run-status``'s (data-status, data-ended)."""
    status = driver.find_element(By.CSS_SELECTOR, "#run-status")
    return status.get_attribute("data-status"), status.get_attribute("data-ended")


def wait_until_ended(driver: WebDriver) -> str:
    """Wait for the run page to show its run ended; the status it shows."""
    wait_for(driver, lambda d: run_status(d)[1] == "true", '#run-status[data-ended="true"]', RUN_SECONDS)
    # A page that reloads itself once the run ended: wait for the reloaded page to hold the run's events too.
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#events li.event"), "the run's events")
    return run_status(driver)[0]


def output_file_row(driver: WebDriver, name: str):
    rows = driver.find_elements(By.CSS_SELECTOR, f'table#files tr.output-file[data-name="{name}"]')
    assert len(rows) == 1, f"{len(rows)} rows for {name}: {texts(driver, 'table#files tr.output-file')}"
    return rows[0]


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


# ----------------------------------------------------------------------------------------------------------------
# Skill libraries


# ----------------------------------------------------------------------------------------------------------------
# Fixtures


@dataclass
class Console:
    """The API (and so the console at /ui) serving for one test, with its teams' keys."""

    url: str
    services: Services
    keys: dict[str, str] = field(default_factory=dict)

    def api(self, team: str = "team-a") -> httpx.Client:
        return api_client(self.url, self.keys[team])


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    return chromium_binaries()


@contextlib.contextmanager
def serving(services: Services, teams: tuple[str, ...] = ("team-a", "team-b")) -> Iterator[Console]:
    keys = {team: new_team(services, team) for team in teams}
    with api_in_a_thread(services) as url:
        yield Console(url=url, services=services, keys=keys)


@pytest.fixture
def console(services: Services) -> Iterator[Console]:
    with serving(services) as served:
        yield served


@pytest.fixture
def browser(chromium, tmp_path: Path) -> Iterator[Callable[[], WebDriver]]:
    """Opens headless Chromiums (each a separate profile: its own cookies and downloads); all are quit in
    teardown, before the server stops."""
    opened: list[WebDriver] = []

    def open_browser() -> WebDriver:
        n = len(opened)
        # Chromium's profile goes in a folder of its own (the run's sandbox user never needs it).
        profile = Path(tempfile.mkdtemp(prefix=f"chromium-{n}-", dir=tmp_path))
        driver = start_chromium(profile / "profile", tmp_path / f"downloads-{n}", chromium)
        opened.append(driver)
        return driver

    yield open_browser
    for driver in opened:
        with contextlib.suppress(Exception):
            driver.quit()


def wait_for_download(folder: Path, seconds: float = WAIT_SECONDS) -> Path:
    """The one file that lands in ``folder`` (a finished download, not Chromium's ``.crdownload``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done = [p for p in folder.iterdir() if not p.name.endswith((".crdownload", ".tmp")) and not p.name.startswith(".")]
        if done and not any(p.name.endswith(".crdownload") for p in folder.iterdir()):
            assert len(done) == 1, f"more than one download: {done}"
            return done[0]
        time.sleep(0.1)
    raise AssertionError(f"nothing was downloaded into {folder} within {seconds}s: {list(folder.iterdir())}")
