"""Properties of ``SKILL.md`` parsing on generated hostile input (hypothesis): it either gives front matter every
reader can serve as JSON, or refuses with ``SkillValidationError``; and what it builds is bounded by what it read.
Front matter of plain ``key: text`` lines, read without the YAML loader, reads exactly as the loader reads it.

The bound is checked by counting (the values and characters the parsed front matter holds against the text's
length), not by timing: an alias, a merge key or any other way to make a few bytes stand for many is refused.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import yaml

from orchestrator.errors import SkillValidationError
from orchestrator.skills import skill
from orchestrator.skills.skill import split_front_matter

EXPANSION = 4
"""Values plus characters the parsed front matter may hold per character of its text (quotes and escapes make it
hold fewer; nothing makes it hold many more)."""

SCALARS = st.one_of(
    st.text(max_size=20), st.integers(), st.floats(), st.booleans(), st.none(),
    st.sampled_from(["2024-01-02", "2024-13-45", "12:30:00", "1_000", "0x1F", "0b101", "0o17", ".nan", "-.inf",
                     "9" * 5000, "~", "null", "yes", "!!binary AAAA", "!!set {a, b}", "!!timestamp x", "!!int 0x",
                     "!!float x", "!!python/name:os.system", "!!str", "&a x", "*a", "<<: *a", "? [a]"]),
)


def _yaml_value(value: object) -> str:
    """A value as YAML text: either raw (whatever it says) or a JSON literal (always a YAML scalar)."""
    return value if isinstance(value, str) else json.dumps(value)


LINES = st.lists(st.tuples(st.integers(0, 6), st.text(min_size=1, max_size=8), SCALARS), max_size=12).map(
    lambda rows: "\n".join(f"{' ' * indent}{key}: {_yaml_value(value)}" for indent, key, value in rows))
ANCHORS = st.integers(1, 12).map(lambda levels: "\n".join(
    [f"a0: &a0 [{', '.join(['x'] * 9)}]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)] + [f"license: *a{levels - 1}"]))
NESTED = st.tuples(st.integers(1, 3000), st.sampled_from(["[", "{a: "])).map(
    lambda spec: "x: " + spec[1] * spec[0] + "1" + ("]" if spec[1] == "[" else "}") * spec[0])
HEADERS = st.one_of(LINES, ANCHORS, NESTED, st.text(max_size=200))


def _size(value: object) -> int:
    """Values and characters in ``value`` (a parsed front matter), counted without recursion."""
    count, pending = 0, [value]
    while pending:
        item = pending.pop()
        count += 1
        if isinstance(item, dict):
            count += sum(len(key) for key in item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            count += len(item)
    return count


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=HEADERS, body=st.text(max_size=50))
def test_front_matter_is_served_as_json_or_refused_and_holds_no_more_than_it_read(header, body):
    text = f"---\nname: some-skill\ndescription: d\n{header}\n---\n{body}"
    try:
        data, rest = split_front_matter(text, "SKILL.md")
    except SkillValidationError as exc:
        assert exc.path == "SKILL.md" and exc.message
        return
    json.dumps(data, allow_nan=False)  # what the API, MCP and the console do with it
    assert isinstance(rest, str)
    assert _size(data) <= EXPANSION * len(text) + 10


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300))
def test_any_text_is_a_skill_file_or_a_clear_refusal(text):
    try:
        data, _ = split_front_matter(text, "SKILL.md")
    except SkillValidationError:
        return
    json.dumps(data, allow_nan=False)


TRICKY = "aZ09 \t:#-?,[]{}&*!|>'\"%@`.~_+=/\\\xa0\x85\u2028\u2029\ufeff\x00\x1b\r\u00e9\U0001f600"
SIMPLE_KEYS = st.one_of(st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,6}", fullmatch=True),
                        st.sampled_from(["yes", "No", "ON", "off", "true", "null", "Null", "y", "n", "name"]))
SIMPLE_VALUES = st.one_of(
    st.text(alphabet=TRICKY, min_size=1, max_size=12),
    st.text(alphabet="ab Z9.,():#-'\"[]\u00e9\xa0", min_size=1, max_size=16),  # mostly text, now and then YAML
    st.sampled_from(["yes", "no", "~", "null", "1.0", "1_000", "0x1F", "2024-01-02", "2024-01-02 10:00:00", ".inf",
                     "-.5", "+1", "1e3", "12:30:00", "190:20:30", "0o17", "<<", "=", "a: b", "a #b", "a:", "C#", "x:y",
                     "Reads CSV, JSON or PDF input (see [docs]) and {explains} each step.", "-x", "? x", "a - b"]),
)
TEXT_VALUES = st.from_regex(r"[A-Za-z0-9\u00e9][A-Za-z0-9 ,.():#'\"\-\[\]{}*&!?\u00e9\xa0]{0,15}", fullmatch=True)
SIMPLE_HEADERS = st.one_of(st.lists(st.tuples(SIMPLE_KEYS, SIMPLE_VALUES), min_size=1, max_size=4),
                           st.lists(st.tuples(SIMPLE_KEYS, TEXT_VALUES), min_size=1, max_size=4)).map(
    lambda rows: "".join(f"{key}: {value}\n" for key, value in rows))


@settings(max_examples=2000, deadline=None)
@given(header=SIMPLE_HEADERS)
def test_front_matter_read_without_the_loader_is_what_the_loader_reads(header):
    simple = skill._simple_front_matter(header)
    if simple is None:
        return
    assert simple == yaml.load(header, Loader=yaml.CSafeLoader) == yaml.load(header, Loader=yaml.SafeLoader)


def test_ordinary_front_matter_is_read_without_the_loader(monkeypatch):
    """Counted: the usual ``name`` / ``description`` / ``license`` lines never reach the YAML loader, and the result
    is the loader's."""
    header = ("name: pdf-tools\ndescription: Extract text and tables from PDF files, fill forms, merge documents. "
              "Use when working with PDFs (forms, scans).\nlicense: Proprietary. LICENSE.txt has complete terms\n")
    loads = []
    monkeypatch.setattr(skill.yaml, "load", lambda *args, **kwargs: loads.append(args) or {})
    data, body = split_front_matter(f"---\n{header}---\n# Body\n", "SKILL.md")
    assert loads == [] and body == "# Body\n"
    monkeypatch.undo()
    assert data == yaml.safe_load(header)
    data, _ = split_front_matter("---\nname: x\ndescription: d\nversion: 1.0\n---\n", "SKILL.md")
    assert data["version"] == 1.0  # a line YAML does not read as text goes to the loader
