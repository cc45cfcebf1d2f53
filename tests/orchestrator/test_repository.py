"""Skill repositories: listing, lookup, problems, caching."""

from __future__ import annotations

import os
import time

import pytest

from orchestrator.errors import SkillNotFoundError, SkillsRootNotFoundError, SkillValidationError
from orchestrator.skills import CachedSkillRepository, FsSkillRepository, create_default_skill_repository
from orchestrator.skills import _watch
from orchestrator.skills import repository as repository_module
from orchestrator.skills import skill as skill_module
from tests.conftest import write_skill


def _bump(path):
    """Make a change visible to mtime checks even on coarse-grained clocks."""
    later = time.time() + 2
    os.utime(path, (later, later))


def test_a_broken_skill_is_reported_and_does_not_hide_the_others(tmp_path):
    write_skill(tmp_path, "good-one")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "SKILL.md").write_text("---\nname: [oops\n---\n")
    write_skill(tmp_path, "good-two")
    repo = FsSkillRepository(tmp_path)
    assert repo.skill_list() == ["good-one", "good-two"]
    (problem,) = repo.problems()
    assert problem.path.endswith("broken/SKILL.md")
    assert "malformed YAML" in problem.message


def test_the_same_name_in_two_roots_is_reported_and_the_first_wins(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    write_skill(first, "same")
    write_skill(second, "same")
    repo = FsSkillRepository([first, second])
    assert repo.path("same") == (first / "same").resolve()
    (problem,) = repo.problems()
    assert problem.field == "name"
    assert str(second / "same" / "SKILL.md") in problem.path
    assert str(first / "same" / "SKILL.md") in problem.message


def test_unknown_skill_error_lists_the_available_ones(tmp_path):
    write_skill(tmp_path, "alpha")
    repo = FsSkillRepository(tmp_path)
    with pytest.raises(SkillNotFoundError, match=r"unknown skill 'beta' \(available: alpha\)"):
        repo.get("beta")


def test_skills_root_that_does_not_exist_is_a_clear_error(tmp_path):
    with pytest.raises(SkillsRootNotFoundError, match="does not exist"):
        FsSkillRepository(tmp_path / "missing")


def test_a_root_that_is_itself_a_skill_and_nested_libraries_are_found(tmp_path):
    write_skill(tmp_path / "team" / "docs", "nested")
    solo = write_skill(tmp_path, "solo")
    assert FsSkillRepository(tmp_path).skill_list() == ["nested", "solo"]
    assert FsSkillRepository(solo).skill_list() == ["solo"]
    ref = FsSkillRepository(tmp_path).skill_ref("nested")
    assert (ref.name, ref.path) == ("nested", "team/docs/nested")


def test_get_returns_body_tools_and_docs(tmp_path):
    write_skill(tmp_path, "weather", body="Tools:\n- get_weather\n\nOverview\n", files={"API.md": "api"})
    skill = FsSkillRepository(tmp_path).get("weather")
    assert skill.tools == ["get_weather"]
    assert skill.doc_names == ["API.md"]
    assert "Overview" in skill.body


@pytest.mark.parametrize("cached", [False, True])
def test_repository_notices_edited_added_and_removed_skills(tmp_path, cached):
    folder = write_skill(tmp_path, "alpha")
    repo = create_default_skill_repository(str(tmp_path), use_cached_repository=cached)
    assert isinstance(repo, CachedSkillRepository) == cached
    assert repo.summaries()[0].description == "The alpha skill."
    assert repo.get("alpha").body == "Run things."

    (folder / "SKILL.md").write_text("---\nname: alpha\ndescription: Edited.\n---\nNew body.\n")
    _bump(folder / "SKILL.md")
    assert repo.summaries()[0].description == "Edited."
    assert repo.get("alpha").body == "New body."

    write_skill(tmp_path, "beta")
    _bump(tmp_path)
    assert repo.skill_list() == ["alpha", "beta"]

    (folder / "SKILL.md").unlink()
    folder.rmdir()
    _bump(tmp_path)
    assert repo.skill_list() == ["beta"]


@pytest.fixture
def parses(monkeypatch):
    """The SKILL.md files parsed for their summaries, in order."""
    seen = []
    real = repository_module._read_summary
    monkeypatch.setattr(repository_module, "_read_summary", lambda path: seen.append(path.parent.name) or real(path))
    return seen


@pytest.mark.parametrize("cached", [False, True])
def test_an_unchanged_skill_md_is_parsed_once_and_one_edit_is_seen_by_the_next_call(tmp_path, parses, cached):
    folders = [write_skill(tmp_path, name) for name in ("alpha", "beta", "gamma")]
    repo = create_default_skill_repository(str(tmp_path), use_cached_repository=cached)
    for _ in range(3):
        assert repo.skill_list() == ["alpha", "beta", "gamma"]
        repo.index(), repo.get("beta"), repo.skill_ref("gamma"), repo.problems()
    assert sorted(parses) == ["alpha", "beta", "gamma"]

    # no clock bump: the same size and, on a coarse clock, the same modification time; the watch still sees it
    text = (folders[1] / "SKILL.md").read_text()
    (folders[1] / "SKILL.md").write_text(text.replace("The beta skill.", "The BETA skill."))
    assert [s.description for s in repo.summaries()] == ["The alpha skill.", "The BETA skill.", "The gamma skill."]
    assert sorted(parses) == ["alpha", "beta", "beta", "gamma"]


def test_the_default_repository_looks_at_the_roots_once_while_nothing_changes(tmp_path, monkeypatch):
    for name in ("alpha", "beta"):
        write_skill(tmp_path, name)
    repo = create_default_skill_repository(str(tmp_path))
    walks = []
    real = FsSkillRepository._skill_dirs
    monkeypatch.setattr(FsSkillRepository, "_skill_dirs", staticmethod(lambda *a: walks.append(a) or real(*a)))
    index = repo.index()
    for _ in range(5):
        assert repo.index() is index  # the index (and so the overview's ranking) is built once for this set
        repo.summaries(), repo.get("alpha"), repo.skill_ref("beta")
    assert len(walks) == 1

    write_skill(tmp_path, "gamma")
    assert repo.skill_list() == ["alpha", "beta", "gamma"]
    assert len(walks) == 2 and repo.index() is not index


def test_a_rescan_that_finds_the_same_skills_keeps_their_index(tmp_path):
    folder = write_skill(tmp_path, "alpha")
    repo = create_default_skill_repository(str(tmp_path))
    index = repo.index()
    repo.index()  # the watch starts here
    (folder / "notes.txt").write_text("not a skill change")  # seen by the watch: the roots are looked at again
    assert repo.index() is index


def test_a_process_holds_a_bounded_number_of_watches_and_the_rest_still_see_changes(tmp_path):
    repos = []
    for n in range(_watch.MAX_WATCHES + 2):
        write_skill(tmp_path / f"lib{n}", "alpha")
        repo = create_default_skill_repository(str(tmp_path / f"lib{n}"))
        repo.summaries(), repo.summaries()  # the second call starts a watch, while there are some left
        repos.append(repo)
    assert sum(r._watch is not None for r in repos) <= _watch.MAX_WATCHES
    assert repos[-1]._watch is None
    last = tmp_path / f"lib{_watch.MAX_WATCHES + 1}" / "alpha" / "SKILL.md"
    last.write_text("---\nname: alpha\ndescription: Edited, longer than before.\n---\nBody.\n")
    assert repos[-1].summaries()[0].description == "Edited, longer than before."


def test_cached_repository_parses_an_unchanged_skill_once(tmp_path, monkeypatch):
    write_skill(tmp_path, "alpha")
    repo = CachedSkillRepository(tmp_path)
    calls = []
    real = repository_module.load_skill
    monkeypatch.setattr(repository_module, "load_skill", lambda *a: calls.append(a) or real(*a))
    repo.get("alpha")
    repo.get("alpha")
    assert len(calls) == 1


def test_a_loaded_skill_the_library_no_longer_has_is_not_kept(tmp_path):
    write_skill(tmp_path, "alpha")
    write_skill(tmp_path, "beta")
    repo = CachedSkillRepository(tmp_path)
    repo.get("alpha")
    repo.get("beta")
    assert set(repo._skills) == {"alpha", "beta"}
    for path in (tmp_path / "beta").iterdir():
        path.unlink()
    (tmp_path / "beta").rmdir()
    assert [s.name for s in repo.summaries()] == ["alpha"]
    assert set(repo._skills) == {"alpha"}


def test_a_skill_whose_doc_is_broken_raises_on_get_with_the_file(tmp_path, monkeypatch):
    write_skill(tmp_path, "alpha", files={"BIG.md": "x" * 100})
    monkeypatch.setattr(skill_module, "MAX_DOC_BYTES", 10)
    with pytest.raises(SkillValidationError, match="BIG.md is larger than 10 bytes"):
        FsSkillRepository(tmp_path).get("alpha")
