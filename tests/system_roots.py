"""Root filesystems for tests (``worker.environments.systems``): one store holding the root with ``figlet`` (a
package this host does not have), built once per session, a fresh store that starts from its downloads, a library
whose skills declare Debian packages, and what a store leaves mounted."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT, write_skill
from tests.environment_stores import environments_maker
from tests.services import ensure_installed, unavailable
from worker.roots.folders import remove_tree


@pytest.fixture(scope="session")
def figlet_store() -> Iterator[Path]:
    """A store holding the root filesystem with ``figlet``, in a folder workspace users can enter (their sandboxes
    are shown the root)."""
    if not IS_ROOT:
        unavailable("root filesystems are built as root (debootstrap): run these tests as root")
    ensure_installed("debootstrap", "debootstrap")
    folder = Path(tempfile.mkdtemp(prefix="skillrun-systems-"))
    folder.chmod(0o755)
    root = folder / "store"
    with environments_maker(root) as make:
        path = asyncio.run(make(systems=True).systems.ensure(("figlet",)))
    assert os.path.lexists(path / "usr/bin/figlet")  # a link into /etc/alternatives, as the root sees it
    yield root
    remove_tree(folder)


@pytest.fixture
def fresh_store(figlet_store: Path, shared_dir: Path) -> Path:
    """An empty store that has the session store's downloads (a hard-linked copy of ``systems/.debs``), as a store's
    second build does."""
    store = shared_dir / "store"
    (store / "systems").mkdir(parents=True, mode=0o711)
    subprocess.run(["cp", "-al", str(figlet_store / "systems/.debs"), str(store / "systems/.debs")], check=True)
    return store


def debian_library(folder: Path, **skills: list[str]) -> Path:
    """A library in ``folder / "library"`` whose skills declare the Debian packages given (in its manifest)."""
    library = folder / "library"
    lines = []
    for name, packages in skills.items():
        write_skill(library, name)
        lines.append(f"[skills.{name}]\ndebian = {json.dumps(packages)}\n")
    (library / "skillrun.toml").write_text("".join(lines))
    return library


def mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as mounts:
        return [line.split()[4] for line in mounts if line.split()[4].startswith(str(path))]
