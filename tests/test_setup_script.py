"""README command one's setup (``.ci/setup``) on a machine that lacks system packages, run by a normal account: it
names each missing package and what to install, says what works until then, and stops only where it cannot go on.

Each test copies the script with ``pyproject.toml`` into a folder of the account's own and runs it with a ``PATH``
that holds only the tools it needs, so the sandbox's packages (bubblewrap, slirp4netns) are missing whatever this
host has. Where the ``.venv`` is up to date the script installs nothing, so these tests reach no package index.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.normal_user import Account, normal_account, run_as
from worker.roots.folders import remove_tree

REPO = Path(__file__).resolve().parents[1]
TOOLS = ("bash", "dirname", "grep", "sha256sum", "cut", "cat", "id", "sed", "ldconfig")
"""What the script runs besides Python (``ldconfig`` answers whether libmagic and libseccomp are there)."""
SANDBOX_HINT = ("until then the local runtime refuses to run commands (it sandboxes each one), unless "
                "SKILLRUN_LOCAL_SANDBOX=false")


@pytest.fixture(scope="module")
def account() -> Account:
    return normal_account()


@pytest.fixture
def checkout(account: Account) -> Path:
    """A folder of the account's own holding ``.ci/setup``, ``pyproject.toml`` and ``bin``, the ``PATH`` it runs
    with: the tools the script needs and nothing else (a ``python3`` is added by each test)."""
    top = Path(tempfile.mkdtemp(prefix="skillrun-setup-"))
    top.chmod(0o755)
    (top / ".ci").mkdir()
    shutil.copy(REPO / ".ci" / "setup", top / ".ci" / "setup")
    shutil.copy(REPO / "pyproject.toml", top / "pyproject.toml")
    bin_dir = top / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
        assert found is not None, f"this host has no {tool}"
        (bin_dir / tool).symlink_to(found)
    for path in (top, *top.rglob("*")):
        os.lchown(path, account.uid, account.gid)
    yield top
    remove_tree(top)


def up_to_date_venv(checkout: Path, account: Account) -> None:
    """A ``.venv`` the script takes as installed for ``pyproject.toml`` (its stamp matches), so it installs nothing."""
    venv_bin = checkout / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to("/usr/bin/python3")
    digest = hashlib.sha256((checkout / "pyproject.toml").read_bytes()).hexdigest()
    (checkout / ".venv" / ".skillrun-installed").write_text(f"{digest} \n")
    for path in (checkout / ".venv", *(checkout / ".venv").rglob("*")):
        os.lchown(path, account.uid, account.gid)


def python_tool(checkout: Path, account: Account, script: str | None = None) -> None:
    """``python3`` on the script's ``PATH``: the host's, or a shell ``script`` standing for one."""
    tool = checkout / "bin" / "python3"
    if script is None:
        tool.symlink_to("/usr/bin/python3")
    else:
        tool.write_text(f"#!/bin/sh\n{script}\n")
        tool.chmod(0o755)
    os.lchown(tool, account.uid, account.gid)


def setup(checkout: Path, account: Account):
    return run_as(account, ["bash", str(checkout / ".ci" / "setup")], cwd=checkout,
                  env={"PATH": str(checkout / "bin")}, timeout=120)


def test_a_machine_without_the_sandbox_packages_is_told_which_to_install_and_what_works_until_then(
    checkout: Path, account: Account
):
    python_tool(checkout, account)
    up_to_date_venv(checkout, account)
    done = setup(checkout, account)
    assert done.returncode == 0, done.stderr
    assert ("missing system packages: bubblewrap slirp4netns; run 'sudo apt-get install bubblewrap slirp4netns'"
            in done.stderr), done.stderr
    assert SANDBOX_HINT in done.stderr
    assert "installing system packages" not in done.stderr, "a normal account's setup tried to install packages"
    assert done.stderr.rstrip().endswith("==> ready: .venv/bin/skillrun --help"), done.stderr


def test_a_python_without_venv_stops_the_setup_naming_python3_venv_and_the_rest_and_makes_nothing(
    checkout: Path, account: Account
):
    shadow = checkout / "no-ensurepip"
    shadow.mkdir()
    (shadow / "ensurepip.py").write_text("raise ImportError('Debian ships ensurepip in python3-venv')\n")
    os.lchown(shadow, account.uid, account.gid)
    python_tool(checkout, account, f'PYTHONPATH={shadow} exec /usr/bin/python3 "$@"')
    done = setup(checkout, account)
    assert done.returncode == 1, done.stderr
    assert ("missing python3-venv: run 'sudo apt-get install python3-venv bubblewrap slirp4netns' and try again"
            in done.stderr), done.stderr
    assert not (checkout / ".venv").exists(), "the setup made a .venv with a Python that cannot make one"


def test_a_machine_without_python_3_11_is_told_what_to_install_and_nothing_is_made(checkout: Path, account: Account):
    python_tool(checkout, account, "exit 1")
    done = setup(checkout, account)
    assert done.returncode == 1
    assert "Python 3.11 or newer is needed: apt-get install python3" in done.stderr, done.stderr
    assert not (checkout / ".venv").exists()
