"""SKILL.md parsing and validation, the Tools: section, docs."""

from __future__ import annotations

import pytest

from orchestrator.errors import SkillValidationError
from orchestrator.skills import load_skill, parse_tools
from tests.conftest import write_skill


def _write(tmp_path, text: str):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "SKILL.md").write_text(text)
    return folder


def test_front_matter_and_body_are_parsed_and_extra_fields_kept(tmp_path):
    folder = _write(tmp_path, (
        "---\nname: pdf-tools\ndescription: Work with PDFs.\nlicense: MIT\nallowed-tools: Bash Read\n"
        "metadata:\n  owner: team-a\n---\n# PDF\nUse it.\n"
    ))
    skill = load_skill(folder, tmp_path)
    assert (skill.name, skill.description) == ("pdf-tools", "Work with PDFs.")
    assert skill.body == "# PDF\nUse it."
    assert skill.license == "MIT"
    assert skill.allowed_tools == ["Bash", "Read"]
    assert skill.metadata == {"owner": "team-a"}


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("no front matter\n", "front matter", "must start with a '---' line"),
        ("---\nname: x\n", "front matter", "no closing '---'"),
        ("---\nname: [unclosed\ndescription: d\n---\n", "front matter", "malformed YAML (line 3)"),
        ("---\n- a\n- b\n---\n", "front matter", "must be a YAML mapping"),
        ("---\ndescription: d\n---\n", "name", "is required"),
        ("---\nname: ok\n---\n", "description", "is required"),
        ("---\nname: Bad_Name\ndescription: d\n---\n", "name", "lowercase letters, digits and single hyphens"),
        ("---\nname: -lead\ndescription: d\n---\n", "name", "lowercase letters"),
        (f"---\nname: {'a' * 65}\ndescription: d\n---\n", "name", "is 65 characters; at most 64"),
        ("---\nname: 12\ndescription: d\n---\n", "name", "must be a string"),
    ],
)
def test_bad_skill_md_names_the_file_and_the_field(tmp_path, text, field, message):
    folder = _write(tmp_path, text)
    with pytest.raises(SkillValidationError) as info:
        load_skill(folder, tmp_path)
    assert info.value.field == field
    assert message in info.value.message
    assert str(folder / "SKILL.md") in str(info.value)


def test_name_of_exactly_64_characters_is_accepted(tmp_path):
    folder = _write(tmp_path, f"---\nname: {'a' * 64}\ndescription: d\n---\n")
    assert load_skill(folder, tmp_path).name == "a" * 64


def test_tools_section_of_the_guide():
    body = (
        "Tools:\n- get_current_weather\n- get_weather_forecast\n- search_city_by_name\n"
        "# comment: this tool is deprecated\n# - old_weather_api\n\nOverview\n- not_a_tool\n"
    )
    assert parse_tools(body) == ["get_current_weather", "get_weather_forecast", "search_city_by_name"]


def test_a_markdown_heading_ends_the_tools_section():
    body = "Tools:\n- alpha\n\n## Usage\n- Call skill_load first\n- beta\n"
    assert parse_tools(body) == ["alpha"]


def test_a_plain_paragraph_ends_the_tools_section():
    body = "Tools:\n- alpha\nThese are the tools.\n- beta\n"
    assert parse_tools(body) == ["alpha"]


def test_name_colon_text_items_declare_the_name():
    body = "Tools:\n- get_weather: current conditions\n* `forecast`: three days\n"
    assert parse_tools(body) == ["get_weather", "forecast"]


def test_tools_inside_a_code_block_are_not_declared():
    assert parse_tools("```\nTools:\n- fake\n```\nText.\n") == []
    assert parse_tools("No tools here.\n- item\n") == []


def test_docs_are_the_other_md_and_txt_files(tmp_path):
    folder = write_skill(tmp_path, "doc-skill", files={
        "USAGE.md": "usage", "reference/api.txt": "api", "scripts/run.py": "print()", ".hidden/x.md": "no",
    })
    skill = load_skill(folder, tmp_path)
    assert skill.doc_names == ["USAGE.md", "reference/api.txt"]
    assert skill.doc("USAGE.md").content == "usage"
