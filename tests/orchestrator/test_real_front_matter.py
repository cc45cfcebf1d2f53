"""Front matter as public libraries write it: a description past the format's 1,024 characters and fields the format
does not have are warnings shown where people look at the skill (``skills show``, the API, the console), not
refusals; an operator's ``SKILLRUN_STRICT_SKILLS`` refuses them; a refused skill's name answers with why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import get_settings
from orchestrator.errors import SkillNotFoundError
from orchestrator.skills import CachedSkillRepository, FsSkillRepository, create_default_skill_repository, load_skill
from tests.conftest import write_skill
from tests.orchestrator.api_helpers import client as api_client
from tests.orchestrator.api_helpers import new_team

LONG = ("Build and debug programs that call the model's API. " * 21).strip()  # 1,091 characters, as real ones


def _real(root: Path, name: str = "model-api") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: {LONG}\nversion: 1.2.0\nauthor: someone\n---\n# Use it\nRead the docs.\n"
    )
    return folder


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKILLRUN_", "OPENAI_")) and k != "SKILLS_ROOT"}
    return {**env, **extra}


def _cli(*args: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=_env(**extra), timeout=60, cwd=str(cwd))


@pytest.fixture
def lenient(monkeypatch):
    monkeypatch.delenv("SKILLRUN_STRICT_SKILLS", raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_a_long_description_and_unknown_fields_are_warnings_of_a_usable_skill(tmp_path, lenient):
    folder = _real(tmp_path)
    write_skill(tmp_path, "plain")
    repository = create_default_skill_repository(tmp_path)
    assert repository.skill_list() == ["model-api", "plain"]
    skill = repository.get("model-api")
    assert skill.description == LONG and skill.body == "# Use it\nRead the docs."
    assert [field for field, _ in skill.summary.warnings] == ["description", "front matter"]
    description, fields = (message for _, message in skill.summary.warnings)
    assert f"is {len(LONG)} characters" in description and "1024" in description
    assert "'author', 'version'" in fields and "kept out" in fields
    problems = repository.problems()
    assert [(p.path, p.field, p.warning, p.kind) for p in problems] == [
        (str(folder / "SKILL.md"), "description", True, "warning"),
        (str(folder / "SKILL.md"), "front matter", True, "warning"),
    ]
    assert load_skill(tmp_path / "plain", tmp_path).summary.warnings == ()
    assert "version" not in skill.metadata  # kept out of the skill


def test_strict_skills_refuse_them_and_the_name_answers_with_the_reason(tmp_path, monkeypatch):
    _real(tmp_path)
    write_skill(tmp_path, "plain")
    monkeypatch.setenv("SKILLRUN_STRICT_SKILLS", "true")
    get_settings.cache_clear()
    try:
        repository = create_default_skill_repository(tmp_path)  # the operator's setting, read by default
    finally:
        get_settings.cache_clear()
    assert repository.strict and repository.skill_list() == ["plain"]
    assert [(p.field, p.warning) for p in repository.problems()] == [("description", False), ("front matter", False)]
    assert list(repository.refused()) == ["model-api"]
    with pytest.raises(SkillNotFoundError) as refused:
        repository.skill_ref("model-api")
    assert "skill 'model-api' cannot be used" in str(refused.value)
    assert f"description: is {len(LONG)} characters" in str(refused.value) and "strict skills" in str(refused.value)
    assert FsSkillRepository(tmp_path, strict=False).skill_list() == ["model-api", "plain"]  # an explicit choice


def test_a_refused_skill_answers_with_its_rule_and_an_unknown_name_with_the_closest(tmp_path, lenient):
    broken = tmp_path / "no-words"
    broken.mkdir()
    (broken / "SKILL.md").write_text("---\nname: no-words\n---\nbody\n")
    write_skill(tmp_path, "plain")
    repository = FsSkillRepository(tmp_path)
    with pytest.raises(SkillNotFoundError, match=r"'no-words' cannot be used: .*no-words/SKILL.md: description: is "
                                                 r"required"):
        repository.get("no-words")
    with pytest.raises(SkillNotFoundError, match=r"unknown skill 'plan' \(available: plain\)"):
        repository.get("plan")
    write_skill(tmp_path / "again", "no-words")  # another folder declares it properly: that one is used
    assert "no-words" in FsSkillRepository(tmp_path).skill_list()
    assert FsSkillRepository(tmp_path).refused() == {}


def test_warnings_survive_the_summary_cache_between_processes(tmp_path, lenient):
    library, cache = tmp_path / "library", tmp_path / "summaries.json"
    _real(library)
    first = CachedSkillRepository(library, summary_cache=cache).problems()
    assert cache.is_file() and [p.field for p in first] == ["description", "front matter"]
    stored = json.loads(cache.read_text())["skills"]
    assert [entry[-1] for entry in stored.values()][0][1][0] == "front matter"
    again = CachedSkillRepository(library, summary_cache=cache)
    assert again.problems() == first and again.get("model-api").summary.warnings
    assert CachedSkillRepository(library, summary_cache=cache, strict=True).skill_list() == []  # refused from it too


def test_the_command_line_shows_warnings_and_says_why_a_refused_skill_cannot_run(tmp_path):
    library = tmp_path / "library"
    _real(library)
    shown = _cli("skills", "show", "model-api", "--skills-root", str(library), "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert [(p["field"], p["warning"]) for p in data["problems"]] == [("description", True), ("front matter", True)]
    human = _cli("skills", "show", "model-api", "--skills-root", str(library), cwd=tmp_path)
    assert "warning: " in human.stdout and "problem: " not in human.stdout
    listed = _cli("skills", "list", "--skills-root", str(library), cwd=tmp_path)
    assert "model-api" in listed.stdout and "warning: " in listed.stderr
    run = _cli("run", "model-api", "true", "--skills-root", str(library), cwd=tmp_path, SKILLRUN_STRICT_SKILLS="1")
    assert run.returncode != 0
    assert "skill 'model-api' cannot be used" in run.stderr and "strict skills" in run.stderr, run.stderr
    assert "unknown skill" not in run.stderr


async def test_the_api_shows_a_skills_warnings(services, tmp_path, lenient):
    _real(tmp_path / "library")
    services.repository = create_default_skill_repository(tmp_path / "library")
    async with api_client(services, new_team(services, "team-a")) as client:
        answer = await client.get("/v1/skills/model-api")
    assert answer.status_code == 200, answer.text
    assert [w["field"] for w in answer.json()["warnings"]] == ["description", "front matter"]


def test_prepare_names_a_refused_skill_of_the_manifest_only_where_it_matters(tmp_path):
    library = tmp_path / "library"
    write_skill(library, "fine")
    (library / "broken").mkdir()
    (library / "broken" / "SKILL.md").write_text("---\nname: broken\n---\nbody\n")
    (library / "skillrun.toml").write_text('[skills.broken]\npython = ["alpha"]\n[skills.fine]\npython = []\n')
    prepare = ("skills", "prepare", "--runtime", "local", "--skills-root", str(library), "--work-root",
               str(tmp_path / "work"))
    whole = _cli(*prepare, cwd=tmp_path)
    assert whole.returncode == 1 and "do not exist" not in whole.stderr
    assert "skillrun.toml names 'broken', which cannot be used: " in whole.stderr
    assert "broken/SKILL.md: description: is required" in whole.stderr
    assert _cli(*prepare, "fine", cwd=tmp_path).returncode == 0  # another skill of the library is prepared
    asked = _cli(*prepare, "broken", cwd=tmp_path)
    assert asked.returncode != 0 and "skill 'broken' cannot be used" in asked.stderr
