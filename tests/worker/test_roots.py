"""URL skills roots: download, cache, limits and path safety, each with the hostile input it refuses."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import io
import os
import stat
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from orchestrator.skills import create_default_skill_repository
from tests.file_server import FileServer
from worker.roots.archives import ArchiveLimits, FetchLimits
from worker.config import WorkerSettings
from worker.contract import RunRequest, SkillRef
from worker.errors import SkillRootError, UnsafeArchiveError
from worker.roots.cache import LEFTOVER_SECONDS, READY_FILE, URLS_DIR, evict
from worker.roots.sources import fetch_url_root, resolve_root, root_in_use
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

SKILL_MD = b"---\nname: remote-skill\ndescription: Fetched from a URL.\n---\nDo remote things.\n"


@pytest.fixture
def server() -> FileServer:
    srv = FileServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


def tar_gz(entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def file_entry(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def library_tar() -> bytes:
    return tar_gz([file_entry("lib/remote-skill/SKILL.md", SKILL_MD), file_entry("lib/remote-skill/run.sh", b"echo hi\n", 0o755)])


def zip_bytes(files: dict[str, bytes], *, attrs: dict[str, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if attrs and name in attrs:
                info.external_attr = attrs[name] << 16
            zf.writestr(info, data)
    return buf.getvalue()


def entries(cache: Path) -> list[str]:
    """The cache's entries (folders named by a digest), without its URL records."""
    return sorted(p.name for p in cache.iterdir() if p.name != URLS_DIR)


def assert_nothing_left(cache: Path) -> None:
    leftovers = [p.name for p in cache.iterdir()] if cache.exists() else []
    assert leftovers == [], f"left behind in the cache: {leftovers}"


def test_tar_gz_root_is_extracted_into_the_cache_with_a_ready_sentinel(server, cache):
    data = library_tar()
    url = server.add("/lib.tar.gz", data)
    root = fetch_url_root(url, cache_dir=cache)
    assert root == cache / hashlib.sha256(data).hexdigest()
    assert (root / "lib" / "remote-skill" / "SKILL.md").read_bytes() == SKILL_MD
    assert (root / READY_FILE).is_file()
    assert os.stat(root / "lib" / "remote-skill" / "run.sh").st_mode & 0o111
    assert entries(cache) == [root.name]


def test_an_intact_entry_is_used_without_downloading_again(server, cache):
    url = server.add("/lib.tgz", library_tar())
    first = fetch_url_root(url, cache_dir=cache)
    second = fetch_url_root(url, cache_dir=cache)
    assert first == second
    assert server.hits["/lib.tgz"] == 1


def test_an_entry_without_ready_is_cleared_and_fetched_again(server, cache):
    url = server.add("/lib.tgz", library_tar())
    root = fetch_url_root(url, cache_dir=cache)
    (root / READY_FILE).unlink()
    (root / "stale-file").write_text("from an interrupted fetch")
    again = fetch_url_root(url, cache_dir=cache)
    assert not (again / "stale-file").exists()
    assert server.hits["/lib.tgz"] == 2


def test_zip_and_magic_bytes_without_a_telling_extension(server, cache):
    zipped = server.add("/download?id=7", zip_bytes({"remote-skill/SKILL.md": SKILL_MD}))
    gz = server.add("/blob", library_tar())
    assert (fetch_url_root(zipped, cache_dir=cache) / "remote-skill" / "SKILL.md").is_file()
    assert (fetch_url_root(gz, cache_dir=cache) / "lib" / "remote-skill" / "SKILL.md").is_file()


def test_a_single_skill_md_url_is_a_root_holding_that_skill(server, cache):
    root = fetch_url_root(server.add("/skills/SKILL.md", SKILL_MD), cache_dir=cache)
    assert (root / "SKILL.md").read_bytes() == SKILL_MD


def test_expected_sha256_is_verified_before_extraction(server, cache):
    data = library_tar()
    url = server.add("/lib.tar.gz", data)
    good = hashlib.sha256(data).hexdigest()
    assert fetch_url_root(url, cache_dir=cache, expected_sha256=good).is_dir()
    with pytest.raises(SkillRootError, match=f"sha256 is {good}, expected 00ff"):
        fetch_url_root(server.add("/other.tar.gz", data), cache_dir=cache, expected_sha256="00ff")
    assert len(entries(cache)) == 1


def test_concurrent_fetches_of_one_url_all_succeed_with_one_entry(server, cache):
    data = library_tar()

    def slow(out):
        time.sleep(0.2)
        out.write(data)

    url = server.add("/slow.tar.gz", slow)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        roots = list(pool.map(lambda _: fetch_url_root(url, cache_dir=cache), range(4)))
    assert len(set(roots)) == 1
    assert entries(cache) == [roots[0].name]
    assert (roots[0] / READY_FILE).is_file()


def _hostile(name: str) -> bytes:
    """A tar whose second entry is called ``name`` (through a PAX header, which can carry any byte)."""
    info, data = file_entry("ok/placeholder", b"pwned")
    info.pax_headers = {"path": name}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        skill, skill_data = file_entry("ok/SKILL.md", SKILL_MD)
        skill.size = len(skill_data)
        tar.addfile(skill, io.BytesIO(skill_data))
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize(
    ("archive", "message"),
    [
        (_hostile("/etc/evil"), "is an absolute path"),
        (_hostile("ok/../../evil"), "climbs out of the archive"),
        (_hostile("C:evil"), "starts with a drive letter"),
        (_hostile("ok\\..\\evil"), "uses a backslash"),
        (_hostile("ok/evil\x00name"), "NUL or control character"),
        (_hostile("ok/evil\nname"), "NUL or control character"),
        (_hostile("ok/\x1b[31mred"), "NUL or control character"),
    ],
)
def test_path_rules_refuse_hostile_tar_names(server, cache, archive, message):
    with pytest.raises(UnsafeArchiveError, match=message):
        fetch_url_root(server.add("/h.tar.gz", archive), cache_dir=cache)
    assert_nothing_left(cache)


def _link(kind: bytes, name: str = "ok/link", target: str = "/etc/passwd") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (_link(tarfile.SYMTYPE), "is a symbolic link"),
        (_link(tarfile.LNKTYPE, target="ok/SKILL.md"), "is a hard link"),
        (_link(tarfile.CHRTYPE, target=""), "is a device"),
        (_link(tarfile.FIFOTYPE, target=""), "is a FIFO"),
    ],
)
def test_links_devices_and_fifos_in_tar_are_refused(server, cache, entry, message):
    archive = tar_gz([file_entry("ok/SKILL.md", SKILL_MD), (entry, None)])
    with pytest.raises(UnsafeArchiveError, match=message):
        fetch_url_root(server.add("/l.tar.gz", archive), cache_dir=cache)
    assert_nothing_left(cache)


def test_symlink_in_zip_external_attributes_is_refused(server, cache):
    archive = zip_bytes({"ok/SKILL.md": SKILL_MD, "ok/link": b"/etc/passwd"}, attrs={"ok/link": stat.S_IFLNK | 0o777})
    with pytest.raises(UnsafeArchiveError, match="is a symbolic link"):
        fetch_url_root(server.add("/s.zip", archive), cache_dir=cache)
    assert_nothing_left(cache)


def test_duplicate_entries_that_would_overwrite_are_refused(server, cache):
    archive = tar_gz([file_entry("ok/SKILL.md", SKILL_MD), file_entry("ok/SKILL.md", b"---\nname: evil\n---\n")])
    with pytest.raises(UnsafeArchiveError, match="appears twice"):
        fetch_url_root(server.add("/d.tar.gz", archive), cache_dir=cache)
    zipped = zip_bytes({"ok/SKILL.md": SKILL_MD, "ok//SKILL.md": b"again"})
    with pytest.raises(UnsafeArchiveError, match="appears twice"):
        fetch_url_root(server.add("/d.zip", zipped), cache_dir=cache)
    assert_nothing_left(cache)


@pytest.mark.parametrize(
    ("limits", "archive", "message"),
    [
        (ArchiveLimits(max_entries=3), tar_gz([file_entry(f"ok/f{i}") for i in range(5)]), "more than 3 entries"),
        (ArchiveLimits(max_entry_bytes=1000), tar_gz([file_entry("ok/SKILL.md", SKILL_MD), file_entry("ok/big", b"a" * 2000)]),
         "larger than 1000 bytes"),
        (ArchiveLimits(max_total_bytes=3000), tar_gz([file_entry(f"ok/f{i}", b"a" * 900) for i in range(5)]),
         "unpacks to more than 3000 bytes"),
    ],
)
def test_archive_limits_are_enforced(server, cache, limits, archive, message):
    with pytest.raises(UnsafeArchiveError, match=message):
        fetch_url_root(server.add("/x.tar.gz", archive), cache_dir=cache, limits=FetchLimits(archive=limits))
    assert_nothing_left(cache)


def test_a_zip_bomb_is_refused_by_the_compression_ratio(server, cache):
    bomb = zip_bytes({"ok/SKILL.md": SKILL_MD, "ok/zeros": b"\0" * (50 * 1024 * 1024)})
    assert len(bomb) < 100 * 1024
    with pytest.raises(UnsafeArchiveError, match="compression bomb"):
        fetch_url_root(server.add("/bomb.zip", bomb), cache_dir=cache)
    assert_nothing_left(cache)


def test_a_nested_bomb_is_refused_and_inner_archives_are_never_opened(server, cache):
    inner = zip_bytes({f"layer{i}": b"\0" * (10 * 1024 * 1024) for i in range(8)})
    outer = zip_bytes({"ok/SKILL.md": SKILL_MD, **{f"ok/nested{i}.zip": inner for i in range(40)}})
    with pytest.raises(UnsafeArchiveError, match="compression bomb|unpacks to more than"):
        fetch_url_root(server.add("/nested.zip", outer), cache_dir=cache, limits=FetchLimits(archive=ArchiveLimits(max_ratio=20)))
    assert_nothing_left(cache)
    # A quine-style archive (one that contains itself) is stored as a file, not unpacked again.
    quine_like = zip_bytes({"ok/SKILL.md": SKILL_MD, "ok/self.zip": inner})
    root = fetch_url_root(server.add("/quine.zip", quine_like), cache_dir=cache)
    assert (root / "ok" / "self.zip").read_bytes() == inner
    assert not (root / "ok" / "layer0").exists()


def test_a_gzip_bomb_inside_a_tar_is_refused(server, cache):
    bomb = tar_gz([file_entry("ok/SKILL.md", SKILL_MD), file_entry("ok/zeros", b"\0" * (60 * 1024 * 1024))])
    with pytest.raises(UnsafeArchiveError, match="compression bomb|larger than"):
        fetch_url_root(server.add("/bomb.tar.gz", bomb), cache_dir=cache)
    assert_nothing_left(cache)


def test_download_size_limit(server, cache):
    url = server.add("/big.tar.gz", library_tar() + b"\0" * 50_000)
    with pytest.raises(UnsafeArchiveError, match="download limit"):
        fetch_url_root(url, cache_dir=cache, limits=FetchLimits(max_download_bytes=10_000))

    def endless(out):
        for _ in range(1000):
            out.write(b"\0" * 10_000)

    with pytest.raises(UnsafeArchiveError, match="exceeds the 10000-byte limit"):
        fetch_url_root(server.add("/endless.tar.gz", endless), cache_dir=cache, limits=FetchLimits(max_download_bytes=10_000))
    assert_nothing_left(cache)


def test_redirects_are_followed_up_to_the_limit(server, cache):
    server.add("/real.tar.gz", library_tar())
    for i in range(4):
        server.add(f"/hop{i}", b"", status=302, headers={"Location": f"/hop{i + 1}" if i < 3 else "/real.tar.gz"})
    assert fetch_url_root(server.url("/hop0"), cache_dir=cache, limits=FetchLimits(max_redirects=5)).is_dir()
    with pytest.raises(SkillRootError, match="more than 2 redirects"):
        fetch_url_root(server.url("/hop1"), cache_dir=cache / "b", limits=FetchLimits(max_redirects=2))
    assert_nothing_left(cache / "b")


def test_a_download_that_never_finishes_times_out(server, cache):
    def trickle(out):
        for _ in range(100):
            out.write(b"\x1f")
            out.flush()
            time.sleep(0.1)

    with pytest.raises(SkillRootError, match="longer than 0.5 s|timed out"):
        fetch_url_root(server.add("/trickle.tar.gz", trickle), cache_dir=cache, limits=FetchLimits(download_seconds=0.5))
    assert_nothing_left(cache)


@pytest.mark.parametrize(
    ("path", "status", "body", "headers", "message"),
    [
        ("/missing.tar.gz", 404, b"no", {}, "HTTP 404"),
        ("/broken.tar.gz", 500, b"oops", {}, "HTTP 500"),
        ("/SKILL.md", 200, b"<!DOCTYPE html><html>login</html>", {"Content-Type": "text/html"}, "HTML page"),
        ("/notes", 200, b"just some text", {}, "not a SKILL.md"),
        ("/empty.zip", 200, zip_bytes({"readme.txt": b"hi"}), {}, "holds no SKILL.md"),
        ("/garbage.zip", 200, b"PK\x03\x04 not really", {}, "not a readable zip"),
    ],
)
def test_bad_urls_get_a_clear_error_and_leave_nothing(server, cache, path, status, body, headers, message):
    url = server.add(path, body, status=status, headers=headers)
    with pytest.raises(SkillRootError, match=message):
        fetch_url_root(url, cache_dir=cache)
    assert_nothing_left(cache)


def test_local_paths_and_file_urls(tmp_path):
    assert resolve_root(str(tmp_path)) == tmp_path
    assert resolve_root(f"file://{tmp_path}") == tmp_path
    with pytest.raises(SkillRootError, match="only http"):
        resolve_root(f"file://{tmp_path}", allow_local=False)
    with pytest.raises(SkillRootError, match="unsupported URL scheme 'ftp'"):
        resolve_root("ftp://example.invalid/x.tgz")


async def test_a_url_root_serves_the_repository_and_runs_through_a_worker(server, cache, monkeypatch, work_root):
    monkeypatch.setenv("SKILLS_CACHE_DIR", str(cache))
    data = library_tar()
    url = server.add("/team-lib.tar.gz", data)
    repo = create_default_skill_repository(url, use_cached_repository=True)
    assert repo.skill_list() == ["remote-skill"]
    ref = repo.skill_ref("remote-skill")
    assert (ref.root, ref.digest, ref.path) == (url, hashlib.sha256(data).hexdigest(), "lib/remote-skill")
    async with LocalWorkspaceRuntime(work_root) as runtime:
        result = await runtime.run(RunRequest(skill=ref, command="bash run.sh; cat SKILL.md | head -2"))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("hi\n---\nname: remote-skill")
    assert server.hits["/team-lib.tar.gz"] == 1


async def test_a_url_library_a_local_run_uses_stays_in_the_cache_until_the_run_ends(server, cache, monkeypatch,
                                                                                    work_root):
    monkeypatch.setenv("SKILLS_CACHE_DIR", str(cache))
    data = library_tar()
    digest = hashlib.sha256(data).hexdigest()
    ref = SkillRef(name="remote-skill", root=server.add("/held.tar.gz", data), path="lib/remote-skill", digest=digest)
    async with LocalWorkspaceRuntime(work_root) as runtime:
        run = asyncio.create_task(runtime.run(RunRequest(
            skill=ref, workspace_id="url", command="touch $WORK_DIR/started; sleep 1; head -1 SKILL.md")))
        for _ in range(400):
            workspace = runtime.workspaces.find("url")
            if workspace is not None and (workspace.work_dir / "started").exists():
                break
            await asyncio.sleep(0.025)
        assert evict(cache, 1) == []  # past any bound, the entry the run holds (its skill links into it) stays
        result = await run
        assert (result.exit_code, result.stdout) == (0, "---\n"), result.stderr
        assert evict(cache, 1) == [digest]  # once the run has ended, it can go


def test_a_sha256_pinned_in_the_url_fragment_is_checked_before_extraction(server, cache):
    data = library_tar()
    good = hashlib.sha256(data).hexdigest()
    url = server.add("/pinned.tar.gz", data)
    root = resolve_root(f"{url}#sha256={good}", cache_dir=cache)
    assert (root / "lib" / "remote-skill" / "SKILL.md").is_file()
    with pytest.raises(SkillRootError, match=f"sha256 is {good}, expected {'0' * 64}"):
        resolve_root(f"{server.add('/other.tar.gz', data)}#sha256={'0' * 64}", cache_dir=cache)
    with pytest.raises(SkillRootError, match="64 hexadecimal digits"):
        resolve_root(f"{url}#sha256=abc", cache_dir=cache)
    assert len(entries(cache)) == 1


def library_version(version: int, size: int = 0) -> bytes:
    """A library archive whose content (so digest) differs by ``version``, holding ``size`` bytes of padding."""
    return tar_gz([file_entry("lib/remote-skill/SKILL.md", SKILL_MD + f"v{version}\n".encode()),
                   file_entry("lib/remote-skill/pad.bin", os.urandom(size))])


def test_two_pinned_digests_of_one_url_live_side_by_side(server, cache):
    first, second = library_version(1), library_version(2)
    url = server.add("/versions.tgz", first)
    old = resolve_root(f"{url}#sha256={hashlib.sha256(first).hexdigest()}", cache_dir=cache)
    server.add("/versions.tgz", second)  # the library was updated in place
    new = resolve_root(f"{url}#sha256={hashlib.sha256(second).hexdigest()}", cache_dir=cache)
    assert old != new and entries(cache) == sorted([old.name, new.name])
    assert (old / "lib/remote-skill/SKILL.md").read_bytes().endswith(b"v1\n")
    assert (new / "lib/remote-skill/SKILL.md").read_bytes().endswith(b"v2\n")
    # Both stay cached: pinning either again downloads nothing; the unpinned URL resolves to the latest download.
    assert resolve_root(f"{url}#sha256={old.name}", cache_dir=cache) == old
    assert resolve_root(url, cache_dir=cache) == new
    assert server.hits["/versions.tgz"] == 2


def test_the_least_recently_used_entries_are_evicted_past_the_bound(server, cache):
    size = 100_000
    urls = [server.add(f"/lib{n}.tgz", library_version(n, size)) for n in range(3)]
    bound = 2 * size + 10_000  # room for two entries
    first = fetch_url_root(urls[0], cache_dir=cache, cache_bytes=bound)
    second = fetch_url_root(urls[1], cache_dir=cache, cache_bytes=bound)
    assert fetch_url_root(urls[0], cache_dir=cache, cache_bytes=bound) == first  # used again: now the most recent
    third = fetch_url_root(urls[2], cache_dir=cache, cache_bytes=bound)
    assert entries(cache) == sorted([first.name, third.name])
    assert not second.exists()
    assert sorted(p.name for p in (cache / URLS_DIR).iterdir()) == sorted(
        hashlib.sha256(u.encode()).hexdigest() for u in (urls[0], urls[2]))  # the evicted URL's record went too
    assert fetch_url_root(urls[1], cache_dir=cache, cache_bytes=bound) == second  # fetched again on its next use
    assert server.hits["/lib1.tgz"] == 2


def test_an_entry_in_use_survives_eviction(server, cache):
    size = 100_000
    old_url, new_url = server.add("/old.tgz", library_version(1, size)), server.add("/new.tgz", library_version(2, size))
    with root_in_use(old_url, cache_dir=cache, cache_bytes=size + 10_000) as held:
        new = fetch_url_root(new_url, cache_dir=cache, cache_bytes=size + 10_000)  # over the bound with both
        assert held.is_dir() and new.is_dir()  # the new one was kept as just placed, the old one as in use
        assert evict(cache, 1) == [new.name]  # past the bound, only the one no run holds goes
        assert (held / "lib/remote-skill/SKILL.md").is_file()
    assert evict(cache, 1) == [held.name]
    assert entries(cache) == []


def test_leftovers_of_a_killed_fetch_are_removed_by_the_next_eviction_and_live_ones_kept(server, cache):
    url = server.add("/lib.tgz", library_version(1, 1000))
    fetch_url_root(url, cache_dir=cache)
    old = time.time() - LEFTOVER_SECONDS - 60
    leftovers = [cache / "tmp-skill-root-dead", cache / "tmp-evicted-dead", cache / URLS_DIR / "tmp-dead"]
    leftovers[0].mkdir()
    (leftovers[0] / "download").write_bytes(b"half")
    leftovers[1].mkdir()
    leftovers[2].write_text("{}")
    live = cache / "tmp-skill-root-live"
    live.mkdir()
    for path in leftovers:
        os.utime(path, (old, old))
    evict(cache, 10**9)
    assert [path.exists() for path in leftovers] == [False, False, False]
    assert live.is_dir() and len(entries(cache)) == 2  # the fetched entry and the live fetch


def test_a_cache_bound_that_is_not_positive_is_refused_clearly(server, cache, monkeypatch):
    for bad in ("0", "-1"):
        monkeypatch.setenv("SKILLRUN_URL_CACHE_BYTES", bad)
        with pytest.raises(ValueError, match="url_cache_bytes\n  Input should be greater than 0"):
            WorkerSettings()
    with pytest.raises(SkillRootError, match="cache bound must be a positive number of bytes, not 0"):
        fetch_url_root(server.add("/lib.tgz", library_tar()), cache_dir=cache, cache_bytes=0)
    assert_nothing_left(cache)
