"""Review of issue 30's SKILL.md fixes: front matter the parser accepts (or half-accepts) that still cannot be shown.

``split_front_matter`` refuses aliases, reads the header's events first and catches the errors a scalar's
construction raises; its values are made plain JSON. These attacks look for what passes that and still breaks a
reader: integers written in a base the decimal digit limit does not cover (``0x``, ``0o``, ``0b``, YAML 1.1's
sexagesimal ``1:2:3``) become numbers of more than 4,300 digits, which Python will not turn into text — not in
``load_skill`` (``str(license)``), not in ``_plain`` (a mapping key), not in any JSON answer (the API, MCP, the
CLI); such an integer, a value or a key, is refused naming where it is. The contained shapes (deep nesting,
10,000 small keys, anchors without aliases, duplicate keys, tags) are kept as plain tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import httpx
import pytest

from orchestrator.api import create_app
from orchestrator.errors import SkillValidationError
from orchestrator.skills import create_default_skill_repository
from orchestrator.skills.skill import (
    MAX_FRONT_MATTER_BYTES,
    load_skill,
    split_front_matter,
)
from tests.orchestrator.api_helpers import new_team
from tests.orchestrator.test_api_teams import skill_md, tar_gz

MiB = 1024 * 1024
HUGE_HEX = "0x" + "f" * 4000
"""16,000 bits: 4,817 decimal digits, past Python's 4,300-digit limit for int -> str (int() of hex has none)."""


def write(root, name: str, front_matter: str, body: str = "Run things.\n") -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(f"---\n{front_matter}\n---\n{body}")


@pytest.fixture
async def api(services):
    """The API as team-a, an unhandled error answered 500 (as a server would) rather than raised into the test."""
    key = new_team(services, "team-a")
    transport = httpx.ASGITransport(app=create_app(services=services), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t",
                                 headers={"Authorization": f"Bearer {key}"}) as c:
        yield c


# ---- integers past the digit limit: refused ------------------------------------------------------------------------

@pytest.mark.parametrize("value", [HUGE_HEX, "0" + "7" * 5400, "0b" + "1" * 16000, "1" + ":1" * 6000])
def test_a_licence_written_as_a_huge_non_decimal_integer_is_a_validation_error(tmp_path, value):
    write(tmp_path, "m", f"name: m\ndescription: d\nlicense: {value}")
    with pytest.raises(SkillValidationError):
        load_skill(tmp_path / "m", tmp_path)


def test_a_huge_hex_mapping_key_is_a_problem_of_the_skill_and_the_others_still_list(tmp_path):
    write(tmp_path, "m", f"name: m\ndescription: d\nmetadata:\n  ? {HUGE_HEX}\n  : x")  # an explicit key: no 1,024-character bound
    write(tmp_path, "good", "name: good\ndescription: fine")
    repository = create_default_skill_repository(tmp_path)
    assert [summary.name for summary in repository.summaries()] == ["good"]
    (problem,) = repository.problems()
    assert "front matter" in problem.field


def test_every_accepted_front_matter_value_can_be_written_as_json(tmp_path):
    write(tmp_path, "m", f"name: m\ndescription: d\nmetadata:\n  n: {HUGE_HEX}")
    try:
        skill = load_skill(tmp_path / "m", tmp_path)
    except SkillValidationError:
        return  # refused with a clear error: the safe outcome
    json.dumps({"license": skill.license, "metadata": skill.metadata}, allow_nan=False)


async def test_a_huge_hex_licence_uploaded_is_refused_or_a_4xx_never_a_500(api):
    files = {"hexed/SKILL.md": f"---\nname: hexed\ndescription: d\nlicense: {HUGE_HEX}\n---\nBody.\n".encode(),
             "good/SKILL.md": skill_md("good")}
    uploaded = await api.post("/v1/libraries/hexed/upload", params={"filename": "h.tar.gz"}, content=tar_gz(files))
    assert uploaded.status_code in (201, 422), uploaded.text
    shown = await api.get("/v1/skills/hexed")
    assert shown.status_code in (404, 422), (shown.status_code, shown.text[:200])
    assert (await api.get("/v1/skills/good")).status_code == 200


# ---- contained -----------------------------------------------------------------------------------------------------

def _peak_in_fresh_process(front_matter: str) -> tuple[int, str]:
    """The most bytes a fresh interpreter held (allocated by Python: tracemalloc's peak) parsing ``front_matter``,
    and how it ended."""
    script = textwrap.dedent("""
        import sys, tracemalloc
        from orchestrator.skills.skill import split_front_matter
        from orchestrator.errors import SkillValidationError
        text = sys.stdin.read()
        import yaml  # loaded before what is measured
        tracemalloc.start()
        try:
            split_front_matter(text, "SKILL.md")
            outcome = "parsed"
        except SkillValidationError as exc:
            outcome = "refused: " + str(exc)[:120]
        print(tracemalloc.get_traced_memory()[1], outcome)
    """)
    done = subprocess.run([sys.executable, "-c", script], input=f"---\n{front_matter}\n---\nbody\n", text=True,
                          capture_output=True, check=True, cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    grown, _, outcome = done.stdout.strip().partition(" ")
    return int(grown), outcome


def _fill(prefix: str, unit: str, suffix: str = "") -> str:
    count = (MAX_FRONT_MATTER_BYTES - len(prefix) - len(suffix) - 64) // len(unit)
    return prefix + unit * count + suffix


@pytest.mark.parametrize(("label", "front_matter"), [
    ("10,000 keys in one flow mapping", "name: m\ndescription: d\nmetadata: {"
     + ",".join(f"{a}{b}{c}" for a in "abcdefghij" for b in "klmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWX"
                for c in "YZ0123456789abcdefghijklmn")[:40000] + "}"),
    ("small nodes: a flow list of 1s", _fill("name: m\ndescription: d\nmetadata: {l: [", "1,", "1]}")),
    ("deep flow nesting", "name: m\ndescription: d\nmetadata: {n: " + "[" * 20000 + "]" * 20000 + "}"),
    ("deep block nesting", "name: m\ndescription: d\nmetadata:\n" + "".join(
        " " * (i + 1) + f"k{i}:\n" for i in range(340)) + " " * 341 + "end"),
    ("anchors without aliases", _fill("name: m\ndescription: d\nmetadata: {l: [", "&a x,", "x]}")),
    ("empty lists", _fill("name: m\ndescription: d\nmetadata: {l: [", "[],", "1]}")),
    ("empty mappings", _fill("name: m\ndescription: d\nmetadata: {l: [", "{},", "1]}")),
    ("a block list of nulls", _fill("name: m\ndescription: d\nmetadata:\n  l:\n", "  -\n", "  - 1")),
    ("tags", _fill("name: m\ndescription: d\nmetadata: {l: [", "!!str x,", "x]}")),
    ("duplicate keys", _fill("name: m\ndescription: d\nmetadata: {", "a: 1,", "a: 2}")),
])
def test_front_matter_at_its_size_costs_memory_bounded_by_it(label, front_matter):
    assert len(front_matter.encode()) <= MAX_FRONT_MATTER_BYTES
    peak, outcome = _peak_in_fresh_process(front_matter)
    assert peak < 512 * MAX_FRONT_MATTER_BYTES, (label, peak, outcome)  # 32 MiB; measured up to 229 B a byte


def test_duplicate_name_keys_are_read_the_same_by_the_summary_and_the_skill(tmp_path):
    write(tmp_path, "m", "name: first\nname: m\ndescription: d")
    repository = create_default_skill_repository(tmp_path)
    assert [summary.name for summary in repository.summaries()] == ["m"]
    assert load_skill(tmp_path / "m", tmp_path).name == "m"


def test_python_tags_are_refused_by_the_safe_loader(tmp_path):
    with pytest.raises(SkillValidationError):
        split_front_matter("---\nname: m\ndescription: d\nx: !!python/object/apply:os.system ['true']\n---\n", "S")
