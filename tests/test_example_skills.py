"""The example library in skills/ loads cleanly and each skill runs as its SKILL.md says."""

from __future__ import annotations

import base64
import io
import json
import struct
import subprocess
import tempfile
import zlib
import zipfile
from pathlib import Path

import pytest

from orchestrator.skills import FsSkillRepository
from tests.conftest import EXAMPLE_SKILLS, IS_ROOT
from worker.contract import InputFile, RunRequest
from worker.environments import (
    EnvironmentBuilder,
    EnvironmentStore,
    SkillEnvironments,
    build_settings,
    local_target,
    read_manifest,
)
from worker.roots.folders import remove_tree
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

LIBRARY = Path(__file__).resolve().parent.parent / "skills"


@pytest.fixture(scope="module")
def repo() -> FsSkillRepository:
    return FsSkillRepository(LIBRARY)


def test_example_library_has_its_eleven_skills_and_no_problems(repo):
    assert repo.skill_list() == EXAMPLE_SKILLS
    assert repo.problems() == []
    assert read_manifest(LIBRARY).unknown_skills(set(repo.skill_list())) == []


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


WEBAPP_CHECK = ('python3 scripts/with_server.py --server "python3 -m http.server {port} --bind 127.0.0.1 --directory '
                'site" --check "/=Example shop" --check "/cart.html=Your cart" --check "/missing.html=404" '
                '--report out/report.json')


async def test_webapp_check_starts_a_server_and_tests_it_in_one_run(repo, runtime):
    result = await runtime.run(RunRequest(skill=repo.skill_ref("webapp-check"), command=WEBAPP_CHECK,
                                          output_files=["out/*"]))
    assert result.exit_code == 0, result.stdout + result.stderr
    [report] = result.output_files
    data = json.loads(report.content)
    assert data["passed"] and [c["status"] for c in data["checks"]] == [200, 200, 404]
    failing = await runtime.run(RunRequest(skill=repo.skill_ref("webapp-check"), command=WEBAPP_CHECK.replace(
        "Your cart", "Checkout"), output_files=["out/report.json"]))
    assert failing.exit_code == 1 and "FAIL /cart.html" in failing.stdout
    assert json.loads(failing.output_files[0].content)["passed"] is False


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


@pytest.fixture(scope="module")
def environments(request: pytest.FixtureRequest) -> SkillEnvironments:
    """One environment store for the module's runs, as the local runtime makes it: built from the real package
    index, once per skill, and as root with the skills' Debian packages in root filesystems (whose builds start
    from the session's downloads: ``tests.system_roots``)."""
    folder = Path(tempfile.mkdtemp(prefix="skillrun-envs-"))
    folder.chmod(0o755)
    if IS_ROOT:
        (folder / "store/systems").mkdir(parents=True, mode=0o711)
        debs = request.getfixturevalue("figlet_store") / "systems/.debs"
        subprocess.run(["cp", "-al", str(debs), str(folder / "store/systems/.debs")], check=True)
    envs = SkillEnvironments(
        EnvironmentBuilder(EnvironmentStore(folder / "store"), build_settings(sandboxed=IS_ROOT)), local_target,
        systems=IS_ROOT,
    )
    yield envs
    envs.close()
    remove_tree(folder)


@pytest.fixture
async def env_runtime(work_root, environments) -> LocalWorkspaceRuntime:
    runtime = LocalWorkspaceRuntime(work_root, environments=environments)
    yield runtime
    await runtime.close()


def test_each_way_of_declaring_dependencies_is_shown(repo, environments):
    declared = {}
    for name in ("pdf-report", "spreadsheet", "markdown-table"):
        skill = repo.get(name)
        declared[name] = environments.declaration(skill.path, LIBRARY, name)
    assert declared["pdf-report"].sources == ("requirements.txt", "skillrun.toml")
    assert declared["pdf-report"].debian == ("poppler-utils",)
    assert declared["spreadsheet"].sources == ("scripts/to_xlsx.py (PEP 723)",)
    assert declared["markdown-table"].sources == ("pyproject.toml", "skillrun.toml")
    assert declared["markdown-table"].python == ("tabulate>=0.9", "wcwidth>=0.2")


async def test_pdf_report_writes_a_real_pdf_with_fpdf2(repo, env_runtime):
    result = await env_runtime.run(RunRequest(
        skill=repo.skill_ref("pdf-report"), command="python3 scripts/report.py --title 'Weekly sales'",
        output_files=["out/report.pdf"],
    ))
    assert result.exit_code == 0, result.stderr
    [pdf] = result.output_files
    assert pdf.mime_type == "application/pdf"
    data = base64.b64decode(pdf.content)
    assert data.startswith(b"%PDF-1.") and data.rstrip().endswith(b"%%EOF")


async def test_spreadsheet_writes_a_real_workbook_with_openpyxl(repo, env_runtime):
    result = await env_runtime.run(RunRequest(
        skill=repo.skill_ref("spreadsheet"), command="python3 scripts/to_xlsx.py work/inputs/sales.csv",
        inputs=[InputFile(name="sales.csv", content=b"label,value\nnorth,3\nsouth,4\n")],
        output_files=["out/summary.xlsx"],
    ))
    assert result.exit_code == 0, result.stderr
    [book] = result.output_files
    assert book.mime_type == "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(book.content))) as archive:
        sheet = archive.read("xl/worksheets/sheet1.xml").decode()
    assert "<f>SUM(B2:B3)</f>" in sheet and "north" in archive_strings(book)


async def test_markdown_table_aligns_wide_characters_with_the_manifests_package(repo, env_runtime):
    result = await env_runtime.run(RunRequest(
        skill=repo.skill_ref("markdown-table"), command="python3 scripts/table.py data/cities.csv",
    ))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("| city") and "Tokyo 東京" in result.stdout
    assert len({_display_width(line) for line in lines}) == 1, "wide characters broke the alignment (no wcwidth)"


async def test_docx_memo_builds_a_word_document_with_the_docx_npm_package(repo, env_runtime):
    result = await env_runtime.run(RunRequest(
        skill=repo.skill_ref("docx-memo"), command="node scripts/memo.js memo.example.json out/memo.docx",
        output_files=["out/memo.docx"],
    ))
    assert result.exit_code == 0, result.stderr
    assert_memo(result)


DOC_TO_PDF = "python3 scripts/to_pdf.py samples/notice.fodt"
PAGE_SCREENSHOT = "python3 scripts/screenshot.py site/index.html --width 640 --height 400"


@pytest.mark.root  # LibreOffice comes from the skill's Debian packages, in a root filesystem built as root
async def test_doc_to_pdf_converts_a_document_with_libreoffice(repo, env_runtime):
    result = await env_runtime.run(RunRequest(skill=repo.skill_ref("doc-to-pdf"), command=DOC_TO_PDF,
                                              output_files=["out/*.pdf"]))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert_converted(result)


@pytest.mark.root  # the Debian Chromium comes from the skill's Debian packages, in a root filesystem built as root
async def test_page_screenshot_drives_the_debian_chromium_with_playwright(repo, env_runtime):
    result = await env_runtime.run(RunRequest(skill=repo.skill_ref("page-screenshot"), command=PAGE_SCREENSHOT,
                                              output_files=["out/page.png"]))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert_screenshot(result)


def assert_converted(result) -> None:  # noqa: ANN001 - a RunResult
    """The run made ``samples/notice.fodt`` a one-page PDF with LibreOffice and read its text back."""
    [pdf] = result.output_files
    assert pdf.name == "out/notice.pdf" and pdf.mime_type == "application/pdf"
    data = base64.b64decode(pdf.content)
    assert data.startswith(b"%PDF-1.") and data.rstrip().endswith(b"%%EOF")
    assert "1 page(s)" in result.stdout
    for text in ("Maintenance notice", "Tuesday", "02:00-04:00"):
        assert text in result.stdout, text


def assert_screenshot(result) -> None:  # noqa: ANN001 - a RunResult
    """The run screenshotted ``site/index.html`` at 640x400 in a Chromium that drew the page (many colours, not a
    blank picture) and read its title."""
    [png] = result.output_files
    data = base64.b64decode(png.content)
    assert png.mime_type == "image/png" and struct.unpack(">II", data[16:24]) == (640, 400)
    assert "title: Skillrun status board" in result.stdout
    assert len(set(_png_pixels(data))) > 32, "the screenshot is blank"


def _png_pixels(data: bytes) -> bytes:
    """The decompressed image data of a PNG (its IDAT chunks)."""
    chunks, offset = [], 8
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        if kind == b"IDAT":
            chunks.append(data[offset + 8:offset + 8 + length])
        offset += 12 + length
    return zlib.decompress(b"".join(chunks))


def assert_memo(result) -> None:  # noqa: ANN001 - a RunResult
    """The run wrote ``memo.example.json`` as a Word document: its title, a paragraph and the table's cells."""
    [memo] = result.output_files
    assert memo.mime_type == "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(memo.content))) as archive:
        document = archive.read("word/document.xml").decode()
    for text in ("Quarterly review", "Sales grew in every region.", "<w:tbl>", "North", "120"):
        assert text in document, text


def archive_strings(book) -> str:  # noqa: ANN001 - an OutputFile
    """The shared strings of a workbook (where openpyxl puts the text cells)."""
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(book.content))) as archive:
        names = archive.namelist()
        return "".join(archive.read(n).decode() for n in names if n.startswith("xl/") and n.endswith(".xml"))


def _display_width(text: str) -> int:
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
