"""Attacks by archive: a library archive 1,500 folders deep, uploaded through the API, registered by URL, or
named as a URL root, is refused with a clear error naming the depth, and leaves nothing in the libraries folder
or the URL-root cache; an archive exactly at the depth limit is still a library; an archive refused for holding
no usable skill leaves nothing either.

Before the depth limit such an archive was a 500 (a walk over the extracted tree recursed once per folder) and left
its temporary tree behind each time (the clean-up recursed too).
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.file_server import FileServer
from tests.orchestrator.api_helpers import client, new_team
from tests.orchestrator.test_api_teams import skill_md
from worker.roots.archives import MAX_ARCHIVE_DEPTH, ArchiveLimits, extract_tar
from worker.errors import UnsafeArchiveError
from worker.roots.sources import fetch_url_root

ATTACK_DEPTH = 1_500
"""Folders of the hostile entry: past Python's recursion limit, so any recursive walk of it fails."""
SKILL_MD = b"---\nname: deep-skill\ndescription: Sits beside a very deep folder.\n---\nDo deep things.\n"


def deep_name(depth: int) -> str:
    """A file name of ``depth`` path components: ``deep/d/d/.../notes.txt``."""
    return "/".join(["deep", *["d"] * (depth - 2), "notes.txt"])


def archive(kind: str, depth: int) -> bytes:
    """A ``tar.gz`` or ``zip`` library: one good skill and a file ``depth`` components deep."""
    files = {"ok/SKILL.md": SKILL_MD, deep_name(depth): b"deep\n"}
    buf = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in files.items():
                zf.writestr(name, data)
    else:
        with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def listing(folder: Path) -> list[str]:
    """What ``folder`` holds, hidden entries too (a folder not there holds nothing)."""
    return sorted(os.listdir(folder)) if folder.exists() else []


@pytest.fixture
def server() -> FileServer:
    srv = FileServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def url_cache(tmp_path, monkeypatch) -> Path:
    """The URL-root cache, in the test's folder."""
    cache = tmp_path / "url-cache"
    monkeypatch.setenv("SKILLS_CACHE_DIR", str(cache))
    return cache


async def _register(services, server, how: str, kind: str, depth: int) -> httpx.Response:
    async with client(services, new_team(services, "team-a")) as api:
        data = archive(kind, depth)
        if how == "upload":
            return await api.post("/v1/libraries/deep/upload", params={"filename": f"deep.{kind}"}, content=data)
        return await api.post("/v1/libraries", json={"name": "deep", "url": server.add(f"/deep.{kind}", data)})


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
@pytest.mark.parametrize("how", ["upload", "url"])
async def test_a_library_1500_folders_deep_is_a_4xx_naming_the_depth_and_leaves_nothing(
    services, server, url_cache, how, kind
):
    libraries = services.libraries.dir
    before = (listing(libraries), listing(url_cache))
    response = await _register(services, server, how, kind, ATTACK_DEPTH)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert f"more than {MAX_ARCHIVE_DEPTH} folders deep" in detail and "deep/d/d/" in detail
    assert (listing(libraries), listing(url_cache)) == before
    assert services.libraries.get("team-a", "deep") is None


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
@pytest.mark.parametrize("how", ["upload", "url"])
async def test_a_library_exactly_at_the_depth_limit_is_registered(services, server, url_cache, how, kind):
    response = await _register(services, server, how, kind, MAX_ARCHIVE_DEPTH)
    assert response.status_code == 201, response.text
    root = services.libraries.root(services.libraries.get("team-a", "deep").version())
    assert (root / deep_name(MAX_ARCHIVE_DEPTH)).read_bytes() == b"deep\n"


async def test_a_library_with_no_usable_skill_is_a_4xx_and_leaves_nothing(services):
    bad = io.BytesIO()
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("broken/SKILL.md", b"---\nname: [unclosed\n---\nNo valid front matter.\n")
    libraries = services.libraries.dir
    before = listing(libraries)
    async with client(services, new_team(services, "team-a")) as api:
        response = await api.post("/v1/libraries/bad/upload", params={"filename": "bad.zip"}, content=bad.getvalue())
    assert response.status_code == 422 and "no usable skill" in response.json()["detail"], response.text
    assert listing(libraries) == before


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_a_url_root_1500_folders_deep_is_an_unsafe_archive_and_leaves_nothing(server, tmp_path, kind):
    cache = tmp_path / "cache"
    url = server.add(f"/deep.{kind}", archive(kind, ATTACK_DEPTH))
    with pytest.raises(UnsafeArchiveError, match=f"more than {MAX_ARCHIVE_DEPTH} folders deep"):
        fetch_url_root(url, cache_dir=cache)
    assert listing(cache) == []


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_a_url_root_exactly_at_the_depth_limit_is_extracted(server, tmp_path, kind):
    root = fetch_url_root(server.add(f"/deep.{kind}", archive(kind, MAX_ARCHIVE_DEPTH)), cache_dir=tmp_path / "cache")
    assert (root / deep_name(MAX_ARCHIVE_DEPTH)).read_bytes() == b"deep\n"
    assert (root / "ok" / "SKILL.md").read_bytes() == SKILL_MD


def test_an_archive_made_with_tar_c_dot_holds_its_root_folder_entry_and_is_accepted(tmp_path):
    library = tmp_path / "library" / "dotted"
    library.mkdir(parents=True)
    (library / "SKILL.md").write_bytes(skill_md("dotted"))
    archive = tmp_path / "lib.tgz"
    subprocess.run(["tar", "czf", str(archive), "-C", str(tmp_path / "library"), "."], check=True)
    dest = tmp_path / "out"
    dest.mkdir()
    extract_tar(archive, dest, ArchiveLimits())
    assert (dest / "dotted" / "SKILL.md").read_bytes() == skill_md("dotted")
