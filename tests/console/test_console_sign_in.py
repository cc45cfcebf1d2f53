"""Signing in to the web console (issue #20) and out again, in Debian's Chromium driven by Selenium: a key opens a
session and a wrong one is refused, signing out forgets the session, a revoked key ends its sessions, every page
sends a signed-out browser to the login page, and every page sends a strict Content-Security-Policy and runs no
inline script.

Cookies, status codes and headers, which the browser cannot show, are checked with httpx against the same server
(the ``console`` and ``browser`` fixtures are in ``conftest.py``).
"""

from __future__ import annotations

import re
import time

import pytest
from selenium.webdriver.common.by import By

from tests.console.conftest import (
    SESSION_COOKIE,
    api_run,
    csp_violations,
    path_of,
    session_client,
    session_cookie,
    sign_in,
    signed_in,
    submit_login,
    wait_for,
    wait_for_message,
    wait_for_path,
)

pytestmark = pytest.mark.slow  # each test starts a server and Chromium: a few seconds apiece


# ----------------------------------------------------------------------------------------------------------------
# Signing in and out


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
    assert "revoked" in wait_for_message(driver, "#error") or "not valid" in wait_for_message(driver, "#error")
    other.get(console.url + "/ui/runs")
    wait_for_path(other, r"/ui/runs")


# ----------------------------------------------------------------------------------------------------------------
# Signed out


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


# ----------------------------------------------------------------------------------------------------------------
# Content-Security-Policy


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
