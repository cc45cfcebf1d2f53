"""Attacks through a ``SKILL.md``: front matter that costs the platform more than its own size to parse or to show.

A library is uploaded by one team and its skills are read by every path that shows or runs them (the API's skill
pages, runs, the agent's ``skill_load``, MCP, the console): each hostile front matter below is refused with an error
naming what is wrong, at upload (the skill is a problem of the library, not one of its skills) and at load, and the
library's other skills are untouched. Memory is checked by the process's peak resident size, not by timing.
"""

from __future__ import annotations

import resource

import pytest

from orchestrator.errors import SkillValidationError
from orchestrator.skills import create_default_skill_repository
from orchestrator.skills.skill import (
    MAX_FRONT_MATTER_BYTES,
    MAX_SKILL_FILE_BYTES,
    load_skill,
)
from tests.orchestrator.api_helpers import client, new_team
from tests.orchestrator.test_api_teams import skill_md, tar_gz

MiB = 1024 * 1024


def alias_bomb(levels: int) -> str:
    """Front matter of ``levels`` nested anchors, each a list of nine aliases of the one before (9**levels items
    once expanded), ending in ``license: *a<levels-1>``: 492 bytes at nine levels."""
    anchors = [f"a0: &a0 [{', '.join(['lol'] * 9)}]"]
    anchors += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(["name: bomb", "description: A skill whose licence is a billion words.", *anchors,
                      f"license: *a{levels - 1}"])


def write(root, name: str, front_matter: str, body: str = "Run things.\n") -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(f"---\n{front_matter}\n---\n{body}")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.fixture
async def api(services):
    async with client(services, new_team(services, "team-a")) as c:
        yield c


async def test_a_yaml_alias_bomb_is_refused_at_upload_and_at_load_and_costs_no_memory(api):
    files = {"bomb/SKILL.md": f"---\n{alias_bomb(8)}\n---\nBoom.\n".encode(), "good/SKILL.md": skill_md("good")}
    before = peak_rss_bytes()
    uploaded = await api.post("/v1/libraries/mixed/upload", params={"filename": "m.tar.gz"}, content=tar_gz(files))
    assert uploaded.status_code == 201, uploaded.text
    listed = (await api.get("/v1/skills")).json()
    assert [skill["name"] for skill in listed] == ["good"]
    shown = await api.get("/v1/skills/bomb")
    assert shown.status_code in (404, 422), shown.text
    run = await api.post("/v1/runs", json={"skill": "bomb", "command": "true"})
    assert 400 <= run.status_code < 500, run.text
    assert (await api.get("/v1/skills/good")).status_code == 200
    assert peak_rss_bytes() - before < 64 * MiB  # eight levels expanded: +300 MB


def test_an_alias_bomb_in_a_folder_is_a_problem_naming_the_alias_and_other_skills_load(tmp_path):
    write(tmp_path, "bomb", alias_bomb(9))
    write(tmp_path, "good", "name: good\ndescription: fine")
    before = peak_rss_bytes()
    for cached in (False, True):
        repository = create_default_skill_repository(tmp_path, use_cached_repository=cached,
                                                     cache_dir=tmp_path.parent / f"cache-{cached}")
        assert [summary.name for summary in repository.summaries()] == ["good"]
        (problem,) = repository.problems()
        assert problem.field == "front matter" and "YAML aliases are not allowed (line 5)" in problem.message
        assert repository.get("good").description == "fine"
    with pytest.raises(SkillValidationError, match="aliases are not allowed"):
        load_skill(tmp_path / "bomb", tmp_path)
    assert peak_rss_bytes() - before < 64 * MiB


@pytest.mark.parametrize(("front_matter", "field", "says"), [
    ("name: m\ndescription: d\nbase: &b {x: 1}\nmetadata:\n  <<: *b", "front matter", "aliases are not allowed"),
    ("name: m\ndescription: d\nreleased: 2024-13-45", "front matter", "month must be in 1..12"),
    ("name: m\ndescription: d\nversion: " + "9" * 5000, "front matter", "a value cannot be read"),
    ("name: m\ndescription: d\nsigned: !!timestamp x", "front matter", "a value cannot be read"),
    ("name: m\ndescription: d\nweight: !!float x", "front matter", "a value cannot be read"),
    ("name: m\ndescription: d\nmetadata: {score: .nan}", "metadata.score", "is not a finite number"),
    ("name: m\ndescription: d\nmetadata: {k: [1, {w: -.inf}]}", "metadata.k[1].w", "is not a finite number"),
    ("name: m\ndescription: d\nicon: !!binary AAAA", "icon", "binary data"),
    ("name: m\ndescription: d\ntags: !!set {a, b}", "tags", "a set"),
    ("name: m\ndescription: d\npad: '" + "x" * MAX_FRONT_MATTER_BYTES + "'", "front matter", "at most 65536"),
])
def test_front_matter_that_cannot_be_served_is_refused_naming_the_field(tmp_path, front_matter, field, says):
    write(tmp_path, "m", front_matter)
    write(tmp_path, "good", "name: good\ndescription: fine")
    repository = create_default_skill_repository(tmp_path)
    assert [summary.name for summary in repository.summaries()] == ["good"]
    (problem,) = repository.problems()
    assert (problem.field, says in problem.message) == (field, True), problem
    with pytest.raises(SkillValidationError, match=says.replace(".", r"\.").replace("[", r"\[")):
        load_skill(tmp_path / "m", tmp_path)


def test_a_skill_file_past_its_size_is_refused_without_being_read_whole(tmp_path):
    write(tmp_path, "huge", "name: huge\ndescription: d", body="x" * MAX_SKILL_FILE_BYTES)
    repository = create_default_skill_repository(tmp_path)
    assert repository.summaries() == []
    (problem,) = repository.problems()
    assert problem.field == "file" and f"larger than {MAX_SKILL_FILE_BYTES} bytes" in problem.message


def test_dates_and_odd_keys_in_front_matter_become_json_values_every_reader_can_serve(tmp_path):
    write(tmp_path, "dated", "name: dated\ndescription: d\nmetadata:\n  released: 2024-05-06\n  1: one\n"
                             "  null: none\n  2024-01-01: new-year\n  list: [2024-05-06T07:08:09Z, 1.5, true]")
    skill = load_skill(tmp_path / "dated", tmp_path)
    assert skill.metadata == {"released": "2024-05-06", "1": "one", "null": "none", "2024-01-01": "new-year",
                              "list": ["2024-05-06T07:08:09+00:00", 1.5, True]}
