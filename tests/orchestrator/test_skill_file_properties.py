"""Properties of ``SKILL.md`` parsing on generated hostile input (hypothesis): it either gives front matter every
reader can serve as JSON, or refuses with ``SkillValidationError``; and what it builds is bounded by what it read.

The bound is checked by counting (the values and characters the parsed front matter holds against the text's
length), not by timing: an alias, a merge key or any other way to make a few bytes stand for many is refused.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import SkillValidationError
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
