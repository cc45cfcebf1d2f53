"""The example library in skills/ loads cleanly and each skill runs as its SKILL.md says."""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import pytest

from orchestrator.skills import FsSkillRepository
from worker.contract import InputFile, RunRequest

LIBRARY = Path(__file__).resolve().parent.parent / "skills"


@pytest.fixture(scope="module")
def repo() -> FsSkillRepository:
    return FsSkillRepository(LIBRARY)


def test_example_library_has_the_four_skills_and_no_problems(repo):
    assert repo.skill_list() == ["data-chart", "python-math", "user-file-ops", "weather-tools"]
    assert repo.problems() == []


def test_weather_tools_declares_exactly_its_three_tools(repo):
    skill = repo.get("weather-tools")
    assert skill.tools == ["get_current_weather", "get_weather_forecast", "search_city_by_name"]
    assert "API_REFERENCE.md" in skill.doc_names


async def test_python_math_fib_writes_out_fib_txt(repo, runtime):
    result = await runtime.run(RunRequest(
        skill=repo.skill_ref("python-math"), command="python3 scripts/fib.py 10 > out/fib.txt", output_files=["out/fib.txt"],
    ))
    assert result.exit_code == 0, result.stderr
    assert result.output_files[0].content.split() == ["0", "1", "1", "2", "3", "5", "8", "13", "21", "34"]


async def test_user_file_ops_summarizes_an_input_file(repo, runtime):
    result = await runtime.run(RunRequest(
        skill=repo.skill_ref("user-file-ops"),
        command="bash scripts/summarize_file.sh work/inputs/user-notes.txt out/user-notes-summary.txt",
        inputs=[InputFile(name="user-notes.txt", content=b"hello from skillrun\nthis is another line\n")],
        output_files=["out/user-notes-summary.txt"],
    ))
    assert result.exit_code == 0, result.stderr
    content = result.output_files[0].content
    assert "Lines: 2" in content and "Words: 7" in content and "Bytes: 41" in content
    assert "hello from skillrun" in content


async def test_data_chart_writes_a_png_and_a_csv_with_their_mime_types(repo, runtime):
    result = await runtime.run(RunRequest(
        skill=repo.skill_ref("data-chart"), command="python3 scripts/chart.py data/sample.csv",
        output_files=["$OUTPUT_DIR/*.{png,csv}"],
    ))
    assert result.exit_code == 0, result.stderr
    files = {f.name: f for f in result.output_files}
    png = base64.b64decode(files["out/chart.png"].content)
    assert files["out/chart.png"].mime_type == "image/png"
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert struct.unpack(">II", png[16:24]) == (320, 200)
    assert files["out/summary.csv"].mime_type == "text/csv"
    assert files["out/summary.csv"].content.startswith("label,value,share")
