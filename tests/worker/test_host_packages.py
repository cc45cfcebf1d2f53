"""Without its sandbox, the local runtime says whether the host has a skill's Debian packages: it then runs commands
on the host's own system."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import write_skill
from tests.services import unavailable
from worker.environments import host_packages
from worker.environments.host_packages import HOST_TAG, HostPackages
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

NOT_A_PACKAGE = "skillrun-no-such-package"



@pytest.fixture(autouse=True)
def debian_host():
    if shutil.which("dpkg-query") is None:
        unavailable("these tests ask dpkg: run them on a Debian or Ubuntu host")


@pytest.fixture
def library(tmp_path):
    root = tmp_path / "library"
    write_skill(root, "has-all")
    write_skill(root, "lacks-one")
    (root / "skillrun.toml").write_text(f'[skills.has-all]\ndebian = ["bash", "coreutils"]\n'
                                        f'[skills.lacks-one]\ndebian = ["bash", "{NOT_A_PACKAGE}"]\n')
    return root


async def test_prepare_and_status_say_which_debian_packages_the_host_lacks(work_root, library):
    async with LocalWorkspaceRuntime(work_root, sandbox=False) as runtime:
        ready = runtime.environment_status(library / "has-all", library, "has-all")
        assert (ready.state, ready.image.state, ready.image.on_host) == ("ready", "ready", True)
        assert ready.image.tag == HOST_TAG
        lacking = runtime.environment_status(library / "lacks-one", library, "lacks-one")
        assert lacking.state == "failed" and lacking.image.state == "failed"
        assert f"not installed on this host: {NOT_A_PACKAGE}." in lacking.message
        assert f"apt-get install {NOT_A_PACKAGE}" in lacking.message and "Docker runtime" in lacking.message
        prepared = await runtime.prepare_environment(library / "lacks-one", library, "lacks-one")
        assert prepared.state == "failed" and NOT_A_PACKAGE in prepared.message


def test_the_answer_is_kept_until_dpkgs_database_changes(tmp_path, monkeypatch):
    status_file = tmp_path / "status"
    status_file.write_text("x")
    packages = HostPackages(str(status_file))
    queries = []
    run = subprocess.run
    monkeypatch.setattr(host_packages.subprocess, "run",
                        lambda *args, **kwargs: queries.append(args) or run(*args, **kwargs))
    assert packages.missing(("bash", NOT_A_PACKAGE)) == [NOT_A_PACKAGE]
    assert packages.missing(("bash", NOT_A_PACKAGE)) == [NOT_A_PACKAGE] and len(queries) == 1
    status_file.write_text("changed")  # a package installed or removed since
    assert packages.missing(("bash", NOT_A_PACKAGE)) == [NOT_A_PACKAGE] and len(queries) == 2
