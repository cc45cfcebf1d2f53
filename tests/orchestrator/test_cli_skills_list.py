"""``skillrun skills list``: the summaries kept between runs, and ``--search``."""

from __future__ import annotations

import json
import os
import time

import pytest

from orchestrator.cli import main
from orchestrator.config import get_settings
from orchestrator.skills import repository as repository_module
from orchestrator.skills.search import SkillIndex
from orchestrator.skills.skill import SkillSummary
from orchestrator.skills.summary_cache import FORMAT as SUMMARY_FORMAT
from orchestrator.skills.summary_cache import MAX_CACHES, TEMPORARY_PREFIX, SummaryCache
from tests.conftest import write_skill


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    path = tmp_path / "data"
    monkeypatch.setenv("SKILLRUN_DATA_DIR", str(path))
    get_settings.cache_clear()
    yield path
    get_settings.cache_clear()


@pytest.fixture
def parses(monkeypatch) -> list:
    calls = []
    real = repository_module._read_summary
    monkeypatch.setattr(repository_module, "_read_summary", lambda path: calls.append(path) or real(path))
    return calls


def _list(capsys, *args: str) -> dict:
    assert main(["skills", "list", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_second_listing_parses_only_what_changed(tmp_path, data_dir, parses, capsys):
    library = tmp_path / "library"
    for name in ("alpha", "beta", "gamma"):
        write_skill(library, name)
    assert [s["name"] for s in _list(capsys, "--skills-root", str(library))["skills"]] == ["alpha", "beta", "gamma"]
    assert len(parses) == 3
    assert len(list((data_dir / "skill-summaries").glob("*.json"))) == 1
    _list(capsys, "--skills-root", str(library))
    assert len(parses) == 3
    skill_file = library / "beta" / "SKILL.md"
    skill_file.write_text("---\nname: beta\ndescription: Changed.\n---\n")
    later = time.time() + 2
    os.utime(skill_file, (later, later))
    listed = _list(capsys, "--skills-root", str(library))["skills"]
    assert {"name": "beta", "description": "Changed."} in listed
    assert [os.path.basename(os.path.dirname(p)) for p in parses[3:]] == ["beta"]


def test_a_corrupt_summary_cache_is_ignored_and_rewritten(tmp_path, data_dir, parses, capsys):
    write_skill(tmp_path / "library", "alpha")
    _list(capsys, "--skills-root", str(tmp_path / "library"))
    (cache,) = (data_dir / "skill-summaries").glob("*.json")
    cache.write_text("{not json")
    assert [s["name"] for s in _list(capsys, "--skills-root", str(tmp_path / "library"))["skills"]] == ["alpha"]
    assert json.loads(cache.read_text())["format"] == SUMMARY_FORMAT


def test_search_lists_the_matching_skills_best_first(tmp_path, data_dir, capsys):
    library = tmp_path / "library"
    write_skill(library, "pdf-merge")
    write_skill(library, "csv-to-pdf")
    write_skill(library, "mailer")
    names = [s["name"] for s in _list(capsys, "--skills-root", str(library), "--search", "merge PDF")["skills"]]
    assert names == ["pdf-merge", "csv-to-pdf"]
    assert main(["skills", "list", "--skills-root", str(library), "--search", "nothing like it"]) == 0
    assert "no skill matches 'nothing like it'" in capsys.readouterr().out


def test_an_empty_search_is_a_usage_error(tmp_path, data_dir, capsys):
    write_skill(tmp_path / "library", "alpha")
    assert main(["skills", "list", "--skills-root", str(tmp_path / "library"), "--search", " "]) == 2
    assert "--search needs a query" in capsys.readouterr().err


@pytest.fixture
def builds(monkeypatch) -> list:
    calls = []
    real = SkillIndex.__init__
    monkeypatch.setattr(SkillIndex, "__init__", lambda self, summaries: calls.append(len(summaries)) or real(self, summaries))
    return calls


def _search(capsys, library, query: str) -> list[str]:
    return [s["name"] for s in _list(capsys, "--skills-root", str(library), "--search", query)["skills"]]


def test_a_second_search_reads_the_kept_index_until_a_description_changes(tmp_path, data_dir, builds, capsys):
    library = tmp_path / "library"
    for name in ("pdf-merge", "csv-to-pdf", "mailer"):
        write_skill(library, name)
    assert _search(capsys, library, "merge PDF") == ["pdf-merge", "csv-to-pdf"]
    assert _search(capsys, library, "merge PDF") == ["pdf-merge", "csv-to-pdf"]
    assert builds == [3]
    skill_file = library / "mailer" / "SKILL.md"
    skill_file.write_text("---\nname: mailer\ndescription: Merge PDF files into mail merges.\n---\n")
    later = time.time() + 2
    os.utime(skill_file, (later, later))
    assert "mailer" in _search(capsys, library, "merge PDF")
    assert builds == [3, 3]


@pytest.mark.parametrize("dump", ["{not json", '{"format": 1, "digest": "x", "index": {}}', "OF_ANOTHER_LIBRARY"])
def test_a_kept_index_that_is_corrupt_or_of_another_library_is_rebuilt(tmp_path, data_dir, builds, capsys, dump):
    library = tmp_path / "library"
    for name in ("pdf-merge", "csv-to-pdf", "mailer"):
        write_skill(library, name)
    _search(capsys, library, "merge PDF")
    (index_file,) = (data_dir / "skill-summaries").glob("*.index.json")
    if dump == "OF_ANOTHER_LIBRARY":  # the right digest, postings pointing past the library's skills
        kept = json.loads(index_file.read_text())
        kept["index"]["postings"] = {term: [[99, 1.0]] for term in kept["index"]["postings"]}
        dump = json.dumps(kept)
    index_file.write_text(dump)
    assert _search(capsys, library, "merge PDF") == ["pdf-merge", "csv-to-pdf"]
    assert builds == [3, 3]
    assert _search(capsys, library, "merge PDF") == ["pdf-merge", "csv-to-pdf"]
    assert builds == [3, 3]


def test_a_folder_of_summary_caches_keeps_the_most_recently_used_and_drops_dead_temporary_files(tmp_path):
    folder = tmp_path / "skill-summaries"
    summary = SkillSummary(name="alpha", description="A.")
    caches = [SummaryCache(folder / f"{n:03d}.json") for n in range(MAX_CACHES + 5)]
    for n, cache in enumerate(caches[:MAX_CACHES]):
        cache.save({f"/lib{n}/alpha/SKILL.md": ((n, 1), summary)})
        cache.index([summary])
        os.utime(cache.path, (1000 + n, 1000 + n))  # saved in this order, a second apart
    assert caches[0].load()  # used again: now the most recently used
    dead, live = folder / f"{TEMPORARY_PREFIX}dead", folder / f"{TEMPORARY_PREFIX}live"
    dead.write_text("{")
    live.write_text("{")
    os.utime(dead, (1, 1))
    for n, cache in enumerate(caches[MAX_CACHES:], start=MAX_CACHES):
        cache.save({f"/lib{n}/alpha/SKILL.md": ((n, 1), summary)})
    kept = sorted(p.name for p in folder.glob("*.json") if not p.name.endswith(".index.json"))
    assert len(kept) == MAX_CACHES and "000.json" in kept and f"{MAX_CACHES + 4:03d}.json" in kept
    assert [n for n in range(1, 7) if f"{n:03d}.json" in kept] == [6]
    assert not (folder / "001.index.json").exists() and (folder / "006.index.json").exists()
    assert not dead.exists() and live.exists()
