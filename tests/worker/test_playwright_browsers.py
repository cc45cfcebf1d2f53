"""Playwright in an environment finds the Debian Chromium (``worker.environments.browsers``): the links a build adds
where Playwright looks, the variable runs get, and what a hostile build's ``browsers.json`` cannot make of them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from worker.environments import EnvironmentInfo, RunEnvironment
from worker.environments.browsers import BROWSERS_FOLDER, CHROMIUM, link_browsers
from worker.errors import EnvironmentBuildError

PYTHON_MANIFEST = "lib/python3.11/site-packages/playwright/driver/package/browsers.json"
NODE_MANIFEST = "node_modules/playwright-core/browsers.json"


def _env(tmp_path: Path, manifest: str, browsers: object) -> Path:
    env = tmp_path / "env"
    (env / manifest).parent.mkdir(parents=True)
    (env / manifest).write_text(browsers if isinstance(browsers, str) else json.dumps({"browsers": browsers}))
    return env


def _links(env: Path) -> dict[str, str]:
    folder = env / BROWSERS_FOLDER
    return {str(p.relative_to(folder)): os.readlink(p) for p in sorted(folder.rglob("*")) if p.is_symlink()}


PLAYWRIGHT_1_65 = [
    {"name": "chromium", "revision": "1255"}, {"name": "chromium-headless-shell", "revision": "1255"},
    {"name": "firefox", "revision": "1572"}, {"name": "ffmpeg", "revision": "1013"},
]


@pytest.mark.parametrize("manifest", [PYTHON_MANIFEST, NODE_MANIFEST])
def test_a_playwright_environment_links_both_chromium_builds_where_playwright_looks(tmp_path, manifest):
    env = _env(tmp_path, manifest, PLAYWRIGHT_1_65)
    assert link_browsers(env) is True
    links = _links(env)
    assert links["chromium-1255/chrome-linux64/chrome"] == CHROMIUM
    assert links["chromium_headless_shell-1255/chrome-headless-shell-linux64/chrome-headless-shell"] == CHROMIUM
    assert links["chromium_headless_shell-1255/chrome-linux/headless_shell"] == CHROMIUM  # older Playwrights' path
    assert set(links.values()) == {CHROMIUM} and not any(name.startswith("firefox") for name in links)
    assert (env / BROWSERS_FOLDER / "chromium-1255/DEPENDENCIES_VALIDATED").is_file()


def test_an_environment_without_playwright_gets_nothing(tmp_path):
    env = tmp_path / "env"
    (env / "lib/python3.11/site-packages/requests").mkdir(parents=True)
    assert link_browsers(env) is False
    assert not (env / BROWSERS_FOLDER).exists()


@pytest.mark.parametrize("browsers", [
    [{"name": "chromium", "revision": "../../../etc"}],          # a path instead of a revision
    [{"name": "chromium", "revision": "1255/../../x"}],
    [{"name": "../chromium", "revision": "1"}],                   # a name Playwright never uses
    [{"name": "chromium", "revision": 1255}],                     # not a string
    [["chromium", "1255"]],
    "{not json",
    json.dumps({"browsers": {"chromium": "1255"}}),
    json.dumps({"browsers": [{"name": "chromium", "revision": "1"}], "pad": "x" * 70_000}),  # past the size read
    [{"name": "chromium", "revision": str(n)} for n in range(2000)],   # thousands of folders to make
])
def test_a_browsers_json_that_names_no_usable_chromium_links_nothing(tmp_path, browsers):
    env = _env(tmp_path, PYTHON_MANIFEST, browsers)
    assert link_browsers(env) is False
    assert not (env / BROWSERS_FOLDER).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env"]


def test_a_browsers_json_that_is_a_link_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"browsers": PLAYWRIGHT_1_65}))
    env = tmp_path / "env"
    (env / NODE_MANIFEST).parent.mkdir(parents=True)
    (env / NODE_MANIFEST).symlink_to(elsewhere)
    assert link_browsers(env) is False and not (env / BROWSERS_FOLDER).exists()


@pytest.mark.parametrize("planted", ["folder", "link"])
def test_a_build_that_left_the_links_folder_is_refused_and_what_it_points_at_untouched(tmp_path, planted):
    env = _env(tmp_path, PYTHON_MANIFEST, PLAYWRIGHT_1_65)
    target = tmp_path / "host-folder"
    target.mkdir()
    if planted == "link":
        (env / BROWSERS_FOLDER).symlink_to(target)
    else:
        (env / BROWSERS_FOLDER).mkdir()
    with pytest.raises(EnvironmentBuildError, match=f"left {BROWSERS_FOLDER} in the environment"):
        link_browsers(env)
    assert list(target.iterdir()) == []


def _info(path: Path, *, browsers: bool) -> EnvironmentInfo:
    return EnvironmentInfo(key="k", path=path, target="t", requirements=[], packages=[], size_bytes=0, built_at=0.0,
                           build_seconds=0.0, last_used=0.0, browsers=browsers)


def test_runs_of_a_playwright_environment_are_told_where_the_links_are(tmp_path):
    env = {"PATH": "/usr/bin"}
    with_playwright = RunEnvironment(python=_info(tmp_path / "py", browsers=True)).variables(env)
    assert with_playwright["PLAYWRIGHT_BROWSERS_PATH"] == str(tmp_path / "py" / BROWSERS_FOLDER)
    node = RunEnvironment(node=_info(tmp_path / "node", browsers=True), python=_info(tmp_path / "py", browsers=False))
    assert node.variables(env)["PLAYWRIGHT_BROWSERS_PATH"] == str(tmp_path / "node" / BROWSERS_FOLDER)
    assert "PLAYWRIGHT_BROWSERS_PATH" not in RunEnvironment(python=_info(tmp_path / "py", browsers=False)).variables(env)
