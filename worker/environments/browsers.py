"""Playwright finds the Debian Chromium: links, in an environment that holds Playwright, where it looks for browsers.

Playwright (its Python package or its npm one) launches Chromium from its own download folder,
``$PLAYWRIGHT_BROWSERS_PATH/<browser>-<revision>/<platform folder>/<program>``, filled by ``playwright install``.
A run cannot fill it (runs are offline) and a build should not: Playwright's download host is rarely one a
deployment reaches, and each Playwright version wants its own 300 MB browser. The distribution's Chromium serves as
both of Playwright's Chromium builds (the browser and the headless shell it launches headless). So once an
environment holding Playwright is built, ``link_browsers`` adds ``BROWSERS_FOLDER`` to it: for each Chromium build
the installed Playwright's ``browsers.json`` names, a link from every path a Playwright version looks at to
``CHROMIUM`` (which a skill gets by declaring the Debian package ``chromium``), and the marker Playwright leaves once
it has checked the browser's libraries (it would write it, and the environment is read-only). Runs get
``PLAYWRIGHT_BROWSERS_PATH`` naming the folder (``RunEnvironment.variables``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from worker.environments.declarations import read_plain_file
from worker.errors import EnvironmentBuildError

BROWSERS_FOLDER = ".skillrun-browsers"
"""The folder of links in an environment, ``PLAYWRIGHT_BROWSERS_PATH`` for its runs."""
CHROMIUM = "/usr/bin/chromium"
"""Debian's Chromium, where the package ``chromium`` puts it (in the Docker image or the local root filesystem)."""
MAX_BROWSERS_JSON_BYTES = 64 * 1024
REVISION = re.compile(r"[0-9]{1,12}")
MAX_BUILDS = 8
"""The most Chromium builds one environment's links are made for (a Playwright asks for two)."""

PROGRAMS = {
    "chromium": ("chrome-linux64/chrome", "chrome-linux/chrome", "chrome-linux-arm64/chrome"),
    "chromium-headless-shell": (
        "chrome-headless-shell-linux64/chrome-headless-shell", "chrome-linux/headless_shell",
        "chrome-headless-shell-linux-arm64/chrome-headless-shell",
    ),
}
"""Where Playwright versions look for each Chromium build inside its folder (by platform and version: the folder
names changed when Playwright moved to Chrome for Testing builds)."""
VALIDATED_MARKER = "DEPENDENCIES_VALIDATED"


def playwright_manifests(env: Path) -> list[Path]:
    """The ``browsers.json`` of each Playwright in the environment ``env``: a Python environment's package, a Node
    environment's ``playwright-core``."""
    found = [env / "node_modules/playwright-core/browsers.json"]
    lib = env / "lib"
    if lib.is_dir() and not lib.is_symlink():
        found += [lib / name / "site-packages/playwright/driver/package/browsers.json"
                  for name in sorted(os.listdir(lib)) if name.startswith("python3")]
    return [path for path in found if _no_link_on_the_way(env, path) and path.is_file()]


def _no_link_on_the_way(env: Path, path: Path) -> bool:
    """Whether nothing from ``env`` down to ``path`` (itself included) is a link: the build may have made any folder
    on the way one, to a host folder, and no process of it is left to change that after this look."""
    here = env
    for part in path.relative_to(env).parts:
        here = here / part
        if here.is_symlink():
            return False
    return True


def chromium_revisions(manifest: Path) -> set[tuple[str, str]]:
    """The Chromium builds (name, revision) a Playwright's ``browsers.json`` asks for; one that is not JSON, or
    names a revision that is not a number, or more than ``MAX_BUILDS`` builds, asks for none (it is the build's
    file: nothing in it becomes a path, and it makes no more than a few folders)."""
    try:
        data = json.loads(read_plain_file(manifest, MAX_BROWSERS_JSON_BYTES, "Playwright's browsers.json",
                                          EnvironmentBuildError))
        browsers = data["browsers"]
    except (EnvironmentBuildError, ValueError, KeyError, TypeError, RecursionError):
        return set()
    wanted = set()
    for browser in browsers if isinstance(browsers, list) else []:
        if not isinstance(browser, dict):
            continue
        name, revision = browser.get("name"), browser.get("revision")
        if isinstance(name, str) and name in PROGRAMS and isinstance(revision, str) and REVISION.fullmatch(revision):
            wanted.add((name, revision))
    return wanted if len(wanted) <= MAX_BUILDS else set()


def link_browsers(env: Path) -> bool:
    """Add ``BROWSERS_FOLDER`` to the sealed environment ``env`` when it holds Playwright; whether it did. Runs as
    the store's owner once the build's processes are gone; a name the build left where the folder goes fails it."""
    wanted = set().union(*(chromium_revisions(path) for path in playwright_manifests(env)))
    if not wanted or len(wanted) > MAX_BUILDS:
        return False
    folder = env / BROWSERS_FOLDER
    try:
        folder.mkdir(mode=0o755)
    except FileExistsError:
        raise EnvironmentBuildError(
            f"the build left {BROWSERS_FOLDER} in the environment, where Skillrun links Playwright's browsers; "
            "it was refused"
        ) from None
    for name, revision in sorted(wanted):
        build = folder / f"{name.replace('-', '_')}-{revision}"
        build.mkdir(mode=0o755)
        (build / VALIDATED_MARKER).touch(mode=0o644)
        for program in PROGRAMS[name]:
            link = build / program
            link.parent.mkdir(mode=0o755, exist_ok=True)
            link.symlink_to(CHROMIUM)
    return True


__all__ = ["BROWSERS_FOLDER", "CHROMIUM", "link_browsers"]
