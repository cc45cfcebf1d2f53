"""Screenshots of the web console's pages, taken with headless Chromium: ``python -m tests.console.screenshots DIR``.

Serves the embedded default (inline runs on the local runtime, the repo's ``skills/`` library) with one team, signs
in, runs ``data-chart`` from its skill page and waits for it, and writes DIR/login.png, skills.png, skill.png,
run.png (the finished run, with its chart previewed), runs.png, operator.png and libraries.png (after a small
library was uploaded, so that it is not empty). Each page is captured at its full height.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from orchestrator.dispatch import InlineDispatcher
from tests.console.conftest import (
    api_client,
    open_page,
    serving,
    sign_in,
    start_chromium,
    submit_run,
    wait_for,
    wait_until_ended,
)
from tests.orchestrator.api_helpers import make_services
from tests.orchestrator.test_api_teams import skill_md, tar_gz
from worker.roots.folders import remove_tree
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

WIDTH = 1280
MIN_HEIGHT = 900
MAX_HEIGHT = 6000
TEAM = "team-demo"


def capture(driver: WebDriver, path: Path) -> None:
    """Save the page at its full height (the window is grown to the page's scroll height, then put back)."""
    page_height = "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)"
    for _ in range(3):  # the window's frame takes some of its height: grow until the viewport holds the page
        missing = driver.execute_script(page_height) - driver.execute_script("return window.innerHeight")
        height = driver.get_window_size()["height"]
        if missing <= 0 or height >= MAX_HEIGHT:
            break
        driver.set_window_size(WIDTH, min(height + missing, MAX_HEIGHT))
    try:
        driver.save_screenshot(str(path))
    finally:
        driver.set_window_size(WIDTH, MIN_HEIGHT)
    print(path, flush=True)


def take(out: Path, work: Path) -> None:
    work_root = work / "work"
    work_root.mkdir(mode=0o755)
    runtime = LocalWorkspaceRuntime(work_root)
    services = make_services(InlineDispatcher({"local": runtime}), runtime.artifact_store, work / "data")
    try:
        with serving(services, (TEAM,)) as console:
            driver = start_chromium(work / "chromium", work / "downloads")
            try:
                driver.get(f"{console.url}/ui/login")
                wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#login-form"), "the login form")
                capture(driver, out / "login.png")

                sign_in(driver, console.url, console.keys[TEAM])
                capture(driver, out / "skills.png")

                open_page(driver, console, "/ui/skills/data-chart", "#run-form")
                capture(driver, out / "skill.png")

                submit_run(driver, console, "data-chart", "python3 scripts/chart.py",
                           output_files=("out/chart.png", "out/summary.csv"))
                status = wait_until_ended(driver)
                if status != "finished":
                    raise SystemExit(f"the data-chart run ended {status}: {driver.find_element(By.TAG_NAME, 'body').text}")
                wait_for(driver, lambda d: d.execute_script(
                    "const i = document.querySelector('img.preview'); return i && i.complete && i.naturalWidth > 0"),
                    "the chart's preview image")
                capture(driver, out / "run.png")

                open_page(driver, console, "/ui/runs", "table#runs")
                capture(driver, out / "runs.png")

                open_page(driver, console, "/ui/operator", "table#queues")
                capture(driver, out / "operator.png")

                with api_client(console.url, console.keys[TEAM]) as api:
                    archive = tar_gz({"team-notes/SKILL.md": skill_md("team-notes", "# Team notes\n\nOur own skill.\n"),
                                      "team-notes/scripts/go.sh": b"echo notes\n"})
                    uploaded = api.post("/v1/libraries/team-skills/upload", params={"filename": "team-skills.tar.gz"},
                                        content=archive)
                    uploaded.raise_for_status()
                open_page(driver, console, "/ui/libraries", "section.library")
                capture(driver, out / "libraries.png")
            finally:
                driver.quit()
    finally:
        asyncio.run(services.close())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.console.screenshots", description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="where the PNG files go (created if missing)")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    # Runs execute as a per-workspace user when this runs as root: their folders must be enterable by others.
    work = Path(tempfile.mkdtemp(prefix="skillrun-screenshots-"))
    work.chmod(0o755)
    try:
        take(args.dir.resolve(), work)
    finally:
        with contextlib.suppress(OSError):
            remove_tree(work)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
