"""Review of the kept skill scans: ``FsSkillRepository`` reusing each parsed ``SKILL.md`` whose stamp (modification
time, size, inode, change time) is unchanged and watching the skill folders with inotify (``FolderWatch``, ``MAX_WATCHES`` a process),
``CachedSkillRepository``'s loaded skills and summary file (``SummaryCache``); the API's per-team repositories and
agents (``Services``: an agent replaced or dropped is closed once its turns end); and ``resolve_runtime`` taking
the worker settings (``SKILLRUN_DOCKER_POOL_SIZE``, ``SKILLRUN_DOCKER_OCI_RUNTIME``, ``SKILLRUN_RUN_CPUS``).

What must hold: a repository's answers follow the disk (an edit, a folder put in place by a rename, a root deleted
and made again, folders made after the watch started, an event queue that overflowed); nothing a library or a
cache file holds (a link, a FIFO, ``/dev/zero``, a huge file, a name breaking the rules) hangs a call, lists what
``get`` refuses, or lists what the parser would refuse; many threads at once see no error; watches come back when
their repositories go; an abandoned turn gives back its count and its retired agent is closed; a hostile setting
is refused in one line naming it, before a container or a control group is made.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.cli import main
from orchestrator.errors import OrchestratorError, SkillNotFoundError
from orchestrator.skills import (
    CachedSkillRepository,
    FsSkillRepository,
    _watch,
    create_default_skill_repository,
)
from orchestrator.skills import repository as repository_module
from orchestrator.skills.repository import _stamp
from orchestrator.skills.summary_cache import FORMAT as SUMMARY_FORMAT
from orchestrator.skills.summary_cache import SummaryCache
from tests.attacks.conftest import run_in  # noqa: F401 - shared fixture
from tests.integration.conftest import docker_engine  # noqa: F401 - shared fixture
from tests.orchestrator.api_helpers import client, new_team
from tests.orchestrator.conftest import model_server  # noqa: F401 - the scripted model
from tests.orchestrator.test_api_team_agents import _closed, _services, _settle, _upload
from tests.services import unavailable
from worker.config import WorkerSettings, get_worker_settings
from worker.errors import RuntimeUnavailableError, WorkerError
from worker.runtimes.base import resolve_runtime

REPO = Path(__file__).resolve().parents[2]
HANG_SECONDS = 2.0
"""How long a call that should take milliseconds may run before it counts as hung (it is then released)."""


def skill(root: Path, folder: str, name: str, description: str, body: str = "Body.\n") -> Path:
    path = root / folder
    path.mkdir(parents=True, exist_ok=True)
    (path / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n{body}")
    return path / "SKILL.md"


def described(repository) -> dict[str, str]:
    return {summary.name: summary.description for summary in repository.summaries()}


def watched(root: Path) -> FsSkillRepository:
    """A default repository over ``root`` whose watch has started (it starts on the first reuse of a scan)."""
    repository = create_default_skill_repository(root)
    repository.summaries(), repository.summaries()
    return repository


def bounded(call: Callable[[], object], release: Callable[[], None]) -> tuple[bool, object]:
    """Run ``call`` in a thread; ``(False, None)`` if it is still running after ``HANG_SECONDS`` — then ``release``
    unblocks it and the thread is joined, so no test leaves one behind."""
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(_attempt(call)), daemon=True)
    thread.start()
    thread.join(HANG_SECONDS)
    done = not thread.is_alive()
    if not done:
        release()
        thread.join(HANG_SECONDS)
    return done, outcome[0] if done else None


def _attempt(call: Callable[[], object]) -> object:
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
        return exc


def open_fifo_writer(path: Path) -> Callable[[], None]:
    """What releases a reader blocked on the FIFO ``path``: a writer that opens and closes (the reader sees EOF)."""

    def release() -> None:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    return release


@pytest.fixture
def worker_env(monkeypatch):
    """Set ``SKILLRUN_*`` worker settings for one test (the settings are cached: cleared around it)."""

    def setenv(**values: str) -> None:
        for key, value in values.items():
            monkeypatch.setenv(key, value)
        get_worker_settings.cache_clear()

    get_worker_settings.cache_clear()
    yield setenv
    monkeypatch.undo()
    get_worker_settings.cache_clear()


@pytest.fixture
def no_docker(monkeypatch) -> list:
    """Records every attempt to connect to Docker (there must be none)."""
    import docker

    calls: list = []
    monkeypatch.setattr(docker, "from_env", lambda *a, **k: calls.append(a) or pytest.fail("Docker was contacted"))
    return calls


# ---- stamps: what an unchanged (modification time, size) hides -------------------------------------------------------

def test_a_same_size_edit_whose_modification_time_is_put_back_is_seen(tmp_path):
    skill_file = skill(tmp_path, "a", "alpha", "first")
    repository = watched(tmp_path)
    before = skill_file.stat()
    skill_file.write_text(skill_file.read_text().replace("first", "again"))
    os.utime(skill_file, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert skill_file.stat().st_size == before.st_size
    assert described(repository) == {"alpha": "again"}


def test_a_skill_folder_replaced_by_a_rename_is_parsed_again_even_with_the_old_stamp(tmp_path):
    root = tmp_path / "root"
    old = skill(root, "a", "alpha", "first")
    repository = watched(root)
    stamp = old.stat()
    new = skill(tmp_path, "incoming", "alpha", "again")
    os.utime(new, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    os.rename(root / "a", tmp_path / "retired")
    os.rename(tmp_path / "incoming", root / "a")
    assert described(repository) == {"alpha": "again"}


# ---- links, FIFOs, devices and huge files in a library ---------------------------------------------------------------

def test_a_skill_md_linking_out_of_its_folder_is_a_problem_and_not_listed(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    target = skill(outside, "x", "beta", "read from outside the library")
    (root / "b").mkdir(parents=True)
    (root / "b" / "SKILL.md").symlink_to(target)
    skill(root, "ok", "okay", "fine")
    repository = create_default_skill_repository(root)
    listed = set(described(repository))
    for name in listed:  # whatever is listed can be loaded
        repository.get(name)
    assert listed == {"okay"}
    assert any("link" in problem.message for problem in repository.problems())


def test_a_skill_folder_linked_from_outside_the_root_answers_as_a_fresh_repository_does_after_an_edit(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    skill(outside, "z", "zeta", "kept outside")
    root.mkdir()
    (root / "z").symlink_to(outside / "z")
    repository = watched(root)
    for name in described(repository):  # whatever is listed can be loaded
        repository.get(name)
    skill(outside, "z", "zeta", "edited outside, longer")
    assert described(repository) == described(create_default_skill_repository(root))
    assert repository.problems() == create_default_skill_repository(root).problems()


def test_a_skill_md_linked_to_a_file_of_its_own_folder_follows_edits_of_that_file(tmp_path):
    folder = tmp_path / "a"
    folder.mkdir()
    (folder / "README.md").write_text("---\nname: alpha\ndescription: first\n---\nBody.\n")
    (folder / "SKILL.md").symlink_to("README.md")
    repository = watched(tmp_path)
    assert repository._watch is not None
    (folder / "README.md").write_text("---\nname: alpha\ndescription: edited, and longer\n---\nBody.\n")
    assert described(repository) == {"alpha": "edited, and longer"}
    assert repository.get("alpha").description == "edited, and longer"


def test_a_skill_md_that_is_dev_zero_or_a_fifo_is_skipped_without_blocking_the_listing(tmp_path):
    (tmp_path / "zero").mkdir()
    (tmp_path / "zero" / "SKILL.md").symlink_to("/dev/zero")
    (tmp_path / "pipe").mkdir()
    os.mkfifo(tmp_path / "pipe" / "SKILL.md")
    skill(tmp_path, "ok", "okay", "fine")
    repository = CachedSkillRepository(tmp_path)
    done, answer = bounded(lambda: (described(repository), described(repository)),
                           open_fifo_writer(tmp_path / "pipe" / "SKILL.md"))
    assert done, "listing a library with a FIFO or /dev/zero as SKILL.md blocked"
    assert answer == ({"okay": "fine"}, {"okay": "fine"})


def test_a_doc_that_is_a_fifo_does_not_block_loading_the_skill(tmp_path):
    skill(tmp_path, "d", "delta", "has a FIFO for a doc")
    os.mkfifo(tmp_path / "d" / "notes.md")
    repository = CachedSkillRepository(tmp_path)
    done, answer = bounded(lambda: repository.get("delta"), open_fifo_writer(tmp_path / "d" / "notes.md"))
    assert done, "get() blocked on a FIFO doc"
    assert not isinstance(answer, Exception) or isinstance(answer, OrchestratorError), answer


def test_a_skill_md_swapped_for_a_huge_file_after_the_first_scan_is_a_problem_read_no_further(tmp_path):
    skill_file = skill(tmp_path, "h", "huge", "small at first")
    skill(tmp_path, "ok", "okay", "fine")
    repository = watched(tmp_path)
    with open(skill_file, "r+b") as file:
        file.truncate(3 * 1024**3)  # sparse: 3 GiB to read, none on disk
    assert described(repository) == {"okay": "fine"}
    (problem,) = repository.problems()
    assert problem.path == str(skill_file) and "larger than" in problem.message


# ---- the root itself: deleted, made again, a link re-pointed ----------------------------------------------------------

@pytest.mark.parametrize("watching", [True, False], ids=["inotify", "modification-times"])
def test_a_root_deleted_and_then_made_again_is_seen_again(tmp_path, monkeypatch, watching):
    if not watching:
        monkeypatch.setattr(repository_module.FolderWatch, "start", classmethod(lambda cls, folders: None))
    root = tmp_path / "root"
    skill(root, "a", "alpha", "first")
    repository = watched(root)
    shutil.rmtree(root)
    assert described(repository) == {}
    assert described(repository) == {}  # the scan of the missing root is reused (and, with inotify, watched)
    skill(root, "a", "alpha", "back again")
    assert described(repository) == {"alpha": "back again"}
    assert repository.problems() == []


def test_a_root_removed_and_made_again_between_two_calls_is_seen(tmp_path):
    root = tmp_path / "root"
    skill(root, "a", "alpha", "first")
    repository = watched(root)
    shutil.rmtree(root)
    skill(root, "b", "beta", "the new library")
    assert described(repository) == {"beta": "the new library"}


def test_a_root_given_as_a_link_stays_the_folder_it_led_to_when_the_link_is_re_pointed(tmp_path):
    first, second, link = tmp_path / "v1", tmp_path / "v2", tmp_path / "current"
    skill(first, "a", "alpha", "one")
    skill(second, "a", "alpha", "two")
    link.symlink_to(first)
    repository = watched(link)
    (tmp_path / "next").symlink_to(second)
    os.replace(tmp_path / "next", link)
    # resolved once, when built: what is listed and what a run stages stay one library, never a mix of the two
    assert described(repository) == {"alpha": "one"}
    assert repository.skill_ref("alpha").root == str(first.resolve())


def test_nested_skill_folders_made_after_the_watch_started_are_found(tmp_path):
    skill(tmp_path, "a", "alpha", "top")
    repository = watched(tmp_path)
    (tmp_path / "group").mkdir()
    assert set(described(repository)) == {"alpha"}
    described(repository)  # the rescan's watch now covers group/
    skill(tmp_path / "group", "deep", "deep", "one down")
    assert set(described(repository)) == {"alpha", "deep"}
    (tmp_path / "group" / "g2" / "g3").mkdir(parents=True)
    skill(tmp_path / "group" / "g2" / "g3", "x", "deeper", "three down")  # made before any call looked
    assert set(described(repository)) == {"alpha", "deep", "deeper"}


# ---- the summary file --------------------------------------------------------------------------------------------------

def _cache_entry(skill_file: Path, name: str, description: str) -> dict:
    info = skill_file.stat()
    return {"format": SUMMARY_FORMAT, "skills": {str(skill_file): [*_stamp(info), name, description, []]}}


@pytest.mark.parametrize("name, description", [
    ("../../etc/passwd", "a name with separators"),
    ("alpha\x1b[2J", "a name with a terminal escape"),
    ("alpha", "d" * 100_000),
], ids=["separators", "escape", "huge-description"])
def test_a_summary_cache_entry_breaking_the_name_rules_is_not_listed(tmp_path, name, description):
    skill_file = skill(tmp_path / "root", "a", "alpha", "the real one")
    cache = tmp_path / "cache.json"
    cache.write_text(json.dumps(_cache_entry(skill_file, name, description)))
    repository = CachedSkillRepository(tmp_path / "root", summary_cache=cache)
    assert described(repository) == {"alpha": "the real one"}
    assert repository.skill_ref("alpha").path == "a"


@pytest.mark.parametrize("content", [
    "[]", '{"format": 1, "skills": []}', '{"format": 1, "skills": {"x": "abcd"}}',
    '{"format": 1, "skills": {"%s": {"a": 1, "b": 2, "c": 3, "d": 4}}}', '{"format": "1", "skills": {}}',
    '{"format": 1, "skills": {"/elsewhere/root/a/SKILL.md": [1, 2, "other", "from another root"]}}',
    '{"format": 1, "skills": {"%s": [null, 2, "alpha", "x"]}}', "{" * 100_000, "\xff\xfe not json",
], ids=["list", "skills-list", "short-string", "dict-entry", "format-text", "other-root", "null-stamp", "deep",
        "not-utf8"])
def test_a_summary_cache_of_wrong_types_or_other_roots_is_ignored_and_rewritten_with_this_root_only(tmp_path, content):
    skill_file = skill(tmp_path / "root", "a", "alpha", "the real one")
    cache = tmp_path / "cache.json"
    cache.write_bytes(content.replace("%s", str(skill_file)).encode("latin-1"))
    repository = CachedSkillRepository(tmp_path / "root", summary_cache=cache)
    assert described(repository) == {"alpha": "the real one"}
    assert list(json.loads(cache.read_text())["skills"]) == [str(skill_file)]


@pytest.mark.parametrize("warnings", [
    "a string", [["description"]], [["a", "b", "c"]], [[1, 2]], [{"field": "x"}], [["x", ["nested"]]], 7,
], ids=["text", "one-part", "three-parts", "numbers", "mapping", "nested", "number"])
def test_a_summary_cache_entry_with_malformed_warnings_is_parsed_again(tmp_path, warnings):
    skill_file = skill(tmp_path / "root", "a", "alpha", "the real one")
    cache = tmp_path / "cache.json"
    entry = _cache_entry(skill_file, "alpha", "planted")  # the right stamp: only the warnings are wrong
    entry["skills"][str(skill_file)][-1] = warnings
    cache.write_text(json.dumps(entry))
    repository = CachedSkillRepository(tmp_path / "root", summary_cache=cache)
    assert described(repository) == {"alpha": "the real one"} and repository.problems() == []
    assert json.loads(cache.read_text())["skills"][str(skill_file)][-2:] == ["the real one", []]


def test_a_summary_cache_entry_of_the_right_shape_is_believed_for_its_stamp(tmp_path):
    skill_file = skill(tmp_path / "root", "a", "alpha", "the real one")
    cache = tmp_path / "cache.json"
    entry = _cache_entry(skill_file, "alpha", "from the cache")
    entry["skills"][str(skill_file)][-1] = [["front matter", "'x' is not a field"]]
    cache.write_text(json.dumps(entry))
    repository = CachedSkillRepository(tmp_path / "root", summary_cache=cache)
    assert described(repository) == {"alpha": "from the cache"}  # not vacuous: the cache is read
    assert [(p.field, p.warning) for p in repository.problems()] == [("front matter", True)]


def test_a_summary_cache_that_is_a_fifo_does_not_block_the_listing(tmp_path):
    skill(tmp_path / "root", "a", "alpha", "the real one")
    cache = tmp_path / "cache.json"
    os.mkfifo(cache)
    repository = CachedSkillRepository(tmp_path / "root", summary_cache=cache)
    done, answer = bounded(lambda: described(repository), open_fifo_writer(cache))
    assert done, "a FIFO for a summary cache blocked the listing"
    assert answer == {"alpha": "the real one"}


def test_a_summary_cache_written_for_one_library_lists_nothing_of_it_for_another(tmp_path):
    skill(tmp_path / "one", "a", "alpha", "of library one")
    skill(tmp_path / "two", "b", "beta", "of library two")
    cache = tmp_path / "shared.json"
    assert described(CachedSkillRepository(tmp_path / "one", summary_cache=cache)) == {"alpha": "of library one"}
    assert described(CachedSkillRepository(tmp_path / "two", summary_cache=cache)) == {"beta": "of library two"}
    assert SummaryCache(cache).load().keys() == {str(tmp_path / "two" / "b" / "SKILL.md")}


# ---- threads ---------------------------------------------------------------------------------------------------------

def test_many_threads_listing_searching_and_loading_while_skills_change_see_no_error_and_end_current(tmp_path):
    for n in range(8):
        skill(tmp_path, f"s{n}", f"s{n}", "version 0")
    repository = CachedSkillRepository(tmp_path)
    stop, errors = threading.Event(), []

    def read() -> None:
        while not stop.is_set():
            try:
                names = {summary.name for summary in repository.summaries()}
                assert {f"s{n}" for n in range(8)} <= names
                repository.index().search("version", 5)
                repository.listing("version")
                assert repository.get("s3").name == "s3"
            except Exception as exc:  # noqa: BLE001 - collected for the assertion below
                errors.append(exc)
                return

    readers = [threading.Thread(target=read) for _ in range(8)]
    for thread in readers:
        thread.start()
    try:
        for version in range(1, 150):  # each edit put in place whole (written in place, a reader may see it empty)
            name = f"s{version % 8}"
            edit = skill(tmp_path / ".edits", name, name, f"version {version} " + "x" * (version % 7))
            os.replace(edit, tmp_path / name / "SKILL.md")
            if version % 25 == 0:
                skill(tmp_path / "more", f"m{version}", f"m{version}", "added under load")
    finally:
        stop.set()
        for thread in readers:
            thread.join()
    assert errors == []
    final = described(repository)
    assert final["s5"] == "version 149 " + "x" * (149 % 7)
    assert {f"m{v}" for v in range(25, 150, 25)} <= set(final)
    assert repository.get("s5").description == final["s5"]


def test_a_skill_removed_while_get_runs_is_skill_not_found(tmp_path, monkeypatch):
    skill(tmp_path, "a", "alpha", "about to go")
    repository = CachedSkillRepository(tmp_path)
    repository.summaries()
    real = repository_module.list_docs

    def removed_meanwhile(skill_dir):
        found = real(skill_dir)
        shutil.rmtree(skill_dir)  # another process removes the skill just now
        return found

    monkeypatch.setattr(repository_module, "list_docs", removed_meanwhile)
    with pytest.raises(SkillNotFoundError):
        repository.get("alpha")


# ---- the watches: bounded, given back, and an overflowed queue -------------------------------------------------------

def test_watches_of_dropped_repositories_are_given_back_and_a_new_repository_watches_again(tmp_path):
    gc.collect()
    free = _watch._open._value
    assert free > 0, "every watch of this process is held by live repositories of other tests"
    repositories = []
    for n in range(_watch.MAX_WATCHES + 4):
        skill(tmp_path / f"lib{n}", "a", "alpha", "x")
        repositories.append(watched(tmp_path / f"lib{n}"))
    assert sum(r._watch is not None for r in repositories) == free
    assert _watch._open._value == 0
    past_the_cap = repositories[-1]
    assert past_the_cap._watch is None
    edited = tmp_path / f"lib{_watch.MAX_WATCHES + 3}" / "a" / "SKILL.md"
    before = edited.stat()
    edited.write_text(edited.read_text().replace("x", "y"))  # same size: only the modification time tells
    os.utime(edited, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert described(past_the_cap) == {"alpha": "y"}
    del repositories, past_the_cap
    gc.collect()
    assert _watch._open._value == free
    skill(tmp_path / "later", "a", "alpha", "z")
    assert watched(tmp_path / "later")._watch is not None


def test_an_event_queue_that_overflowed_still_counts_as_a_change(tmp_path):
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if limit > 200_000:
        unavailable(f"fs.inotify.max_queued_events is {limit}: overflowing it would take too long; run with the "
                    "default (16384): sysctl fs.inotify.max_queued_events=16384")
    skill(tmp_path, "a", "alpha", "first")
    repository = watched(tmp_path)
    assert repository._watch is not None
    for n in range(limit // 2 + 100):  # two events each (create, close after write): past the queue's length
        open(tmp_path / "a" / f"f{n}", "w").close()
    skill(tmp_path, "b", "beta", "made after the queue overflowed")  # its events are dropped; IN_Q_OVERFLOW is kept
    assert set(described(repository)) == {"alpha", "beta"}


# ---- the API's team agents -------------------------------------------------------------------------------------------

async def _turn_under_way(services, c, model_server):  # noqa: F811
    await _upload(c, 1)
    assert (await c.post("/v1/sessions", json={"session_id": "s1"})).status_code == 201
    model_server.add({"text": "a long answer in several parts"})
    turn = services.turn(services.teams.get_team("team-a"), "s1", "hi")
    assert (await anext(turn)).partial
    entry = services._libraries["team-a"]
    assert entry.turns == 1
    return turn, entry


@pytest.mark.parametrize("abandon", ["aclose", "garbage-collected"])
async def test_a_turn_abandoned_mid_stream_gives_back_its_count_and_its_retired_agent_is_closed(
        model_server, work_root, abandon):  # noqa: F811
    services, built = _services(model_server, work_root)
    async with client(services, new_team(services, "team-a")) as c:
        turn, entry = await _turn_under_way(services, c, model_server)
        await _upload(c, 2)
        services.repository_for(services.teams.get_team("team-a"))  # retired while the turn is under way
        await _settle()
        assert entry.retired and not _closed(built[0])
        if abandon == "aclose":
            await turn.aclose()
        else:
            del turn
            gc.collect()  # the loop's async-generator finaliser closes it
        await _settle()
        assert entry.turns == 0 and entry.agent is None and _closed(built[0])
    await services.close()


async def test_uploads_turns_and_lookups_from_worker_threads_at_once_leave_one_live_agent(
        model_server, work_root):  # noqa: F811
    services, built = _services(model_server, work_root)
    team_key = new_team(services, "team-a")
    team = services.teams.get_team("team-a")
    async with client(services, team_key) as c:
        await _upload(c, 0)
        for n in range(4):
            assert (await c.post("/v1/sessions", json={"session_id": f"s{n}"})).status_code == 201
        stop = threading.Event()

        def look_up() -> int:
            seen = 0
            while not stop.is_set():
                assert [s.name for s in services.repository_for(team).summaries()] == ["team-skill"]
                seen += 1
            return seen

        async def chat(n: int) -> None:
            model_server.add({"text": f"answer {n}"})
            events = [event async for event in services.turn(team, f"s{n % 4}", "hi")]
            assert events[-1].is_final_response()

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            lookups = [pool.submit(look_up) for _ in range(4)]
            try:
                for version in range(1, 4):
                    await asyncio.gather(chat(2 * version), chat(2 * version + 1), _upload(c, version))
            finally:
                stop.set()
            assert all(future.result() > 0 for future in lookups)
        await _settle()
        (current,) = services._libraries.values()
        assert current.turns == 0
        live = [agent for agent in built if not _closed(agent)]
        assert live == ([current.agent] if current.agent is not None else [])
    await services.close()
    assert all(_closed(agent) for agent in built)


# ---- the runtimes' settings -------------------------------------------------------------------------------------------

HOSTILE_DOCKER = [
    ("SKILLRUN_DOCKER_POOL_SIZE", "-1", "docker_pool_size"),
    ("SKILLRUN_DOCKER_POOL_SIZE", "1000000", "docker_pool_size"),
    ("SKILLRUN_DOCKER_POOL_SIZE", "lots", "docker_pool_size"),
    ("SKILLRUN_DOCKER_OCI_RUNTIME", "../../bin/sh", "docker_oci_runtime"),
    ("SKILLRUN_DOCKER_OCI_RUNTIME", "runc --privileged", "docker_oci_runtime"),
    ("SKILLRUN_DOCKER_OCI_RUNTIME", "-runc", "docker_oci_runtime"),
]


@pytest.mark.parametrize("variable, value, setting", HOSTILE_DOCKER)
def test_a_hostile_docker_setting_is_refused_by_resolve_runtime_naming_it_before_docker_is_reached(
        worker_env, no_docker, tmp_path, variable, value, setting):
    worker_env(**{variable: value})
    with pytest.raises(ValidationError) as refused:
        resolve_runtime("docker", work_root=tmp_path)
    assert [error["loc"] for error in refused.value.errors()] == [(setting,)]
    assert no_docker == []


@pytest.mark.parametrize("variable, value, setting", HOSTILE_DOCKER)
def test_a_hostile_docker_setting_stops_skillrun_worker_with_one_line_naming_it(
        worker_env, no_docker, capsys, variable, value, setting):
    worker_env(**{variable: value})
    assert main(["worker", "--runtime", "docker", "--burst", "--redis-url", "redis://127.0.0.1:9"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"skillrun: error: {setting}: ")
    assert no_docker == []


def test_python_m_worker_with_a_hostile_setting_says_so_in_one_line():
    env = {**os.environ, "SKILLRUN_DOCKER_POOL_SIZE": "-1"}
    done = subprocess.run([sys.executable, "-m", "worker", "--runtime", "docker", "--burst", "--redis-url",
                           "redis://127.0.0.1:9"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "docker_pool_size" in line


@pytest.mark.parametrize("value", ["inf", "1e300", "nan", "0", "-2"])
def test_a_run_cpus_setting_that_no_control_group_can_take_is_refused_by_the_settings(worker_env, value):
    worker_env(SKILLRUN_RUN_CPUS=value)
    with pytest.raises(ValidationError) as refused:
        WorkerSettings()
    assert [error["loc"] for error in refused.value.errors()] == [("run_cpus",)]

@pytest.mark.parametrize("value", ["1024", str(10**30), "-1"])
def test_a_tmpfs_size_no_mount_can_take_is_refused_by_the_settings(worker_env, value):
    worker_env(SKILLRUN_RUN_TMPFS_BYTES=value)
    with pytest.raises(ValidationError) as refused:
        WorkerSettings()
    assert [error["loc"] for error in refused.value.errors()] == [("run_tmpfs_bytes",)]


@pytest.mark.parametrize("pool_size", [-1, 1_000_000])
def test_a_pool_size_argument_out_of_the_settings_bounds_is_refused(worker_env, no_docker, tmp_path, pool_size):
    worker_env()
    with pytest.raises((ValueError, WorkerError), match="pool_size"):
        resolve_runtime("docker", work_root=tmp_path, pool_size=pool_size)
    assert no_docker == []


async def _bogus_oci_run(docker_engine, work_root, run_in, worker_env):  # noqa: F811
    worker_env(SKILLRUN_DOCKER_OCI_RUNTIME="no-such-runtime", SKILLRUN_DOCKER_POOL_SIZE="1")
    runtime = resolve_runtime("docker", work_root=work_root / "docker", client=docker_engine.client)
    try:
        async with runtime:
            with pytest.raises(WorkerError) as failed:
                await runtime.run(run_in("echo hi"))
            await runtime.idle()
        return failed.value, [c.name for c in docker_engine.client.containers.list(
            all=True, ignore_removed=True, filters={"label": f"skillrun.work_root={runtime.work_root.resolve()}"})]
    finally:
        runtime.remove_containers()


@pytest.mark.docker
async def test_an_oci_runtime_the_engine_lacks_fails_the_run_in_one_line_and_leaves_no_container(
        docker_engine, work_root, run_in, worker_env):  # noqa: F811
    error, left = await _bogus_oci_run(docker_engine, work_root, run_in, worker_env)
    assert isinstance(error, RuntimeUnavailableError)
    assert "\n" not in str(error) and "no-such-runtime" in str(error)
    assert left == []


@pytest.mark.docker
async def test_an_oci_runtime_the_engine_lacks_is_named_as_the_setting(
        docker_engine, work_root, run_in, worker_env):  # noqa: F811
    error, _ = await _bogus_oci_run(docker_engine, work_root, run_in, worker_env)
    assert "oci_runtime" in str(error).lower()
