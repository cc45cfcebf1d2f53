"""One reading of a glob pattern everywhere: the glob module (``worker.collect.globs``) that output collection and
the file tools' Glob use, the extended regular expression the Cube runtime lists by in its sandbox (hypothesis:
they agree on every pattern and path), and the operations' text a sandbox runs, which carries the module's text."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.tools.file_tools.workspace import OPS_SOURCE
from orchestrator.tools.file_tools.workspace_skill import ops
from worker.collect import globs

NAME_CHARS = "ab.-_"
names = st.text(NAME_CHARS, min_size=1, max_size=4).filter(lambda n: n not in (".", ".."))
segments = st.one_of(names, st.sampled_from(["*", "?", "*.a", ".*", "a*", "[ab]*", "[!a]", "**"]))
paths = st.lists(names, min_size=1, max_size=4).map(tuple)
patterns = st.lists(segments, min_size=1, max_size=4).map(tuple).filter(lambda s: s[-1] != "**")


@settings(max_examples=600, deadline=None)
@given(paths, patterns)
def test_the_cube_listings_expression_matches_what_the_glob_module_matches(parts, pattern):
    expression = globs.glob_regex(list(pattern))
    assert bool(re.fullmatch(expression, "/".join(parts))) == globs.segments_match(parts, pattern), expression


@pytest.mark.parametrize("pattern", ["**/*.py", "*.{md,txt}", "a/**", ".hidden/*", "{a,b}/{c,d{e,f}}/*", "[!.]*",
                                     "a{{,}"])
def test_glob_in_a_sandbox_answers_as_glob_on_the_host(tmp_path, pattern):
    """The operations' text as a sandbox's python runs it (isolated: no package to import) finds what the host's
    Glob finds."""
    for name in ("a/x.py", "a/b/y.py", "a/.hidden.py", ".hidden/z.txt", "notes.md", "todo.txt", "b/c/w",
                 "b/df/v", "a{/u"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    host = ops.glob(ops.Root(str(tmp_path), absolute=False), pattern)
    done = subprocess.run([sys.executable, "-I", "-S", "-c", OPS_SOURCE, str(tmp_path), "glob",
                           json.dumps({"pattern": pattern})], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == host
    assert host["success"] and host["matches"], host  # each pattern finds something: a comparison of substance


def test_a_pattern_of_too_many_alternatives_is_refused_alike_by_collection_and_glob(tmp_path):
    pattern = "{a,b}" * 9  # 512 alternatives
    with pytest.raises(ValueError, match="expands to more than 256 patterns"):
        globs.expand_braces(pattern)
    answer = ops.call(ops.Root(str(tmp_path)), "glob", {"pattern": pattern})
    assert answer == {"success": False, "error": f"pattern {pattern!r} expands to more than 256 patterns"}


def test_a_pattern_of_many_double_stars_costs_parts_times_segments_not_more(monkeypatch):
    """``**/a/**/a/…/b`` against a deep path of ``a``: backtracking tries every way to split the path (a model's Glob
    pattern would burn the host's CPU in host mode); each (part, segment) pair is decided once instead."""
    calls = 0
    real = globs.name_matches

    def counted(name: str, segment: str) -> bool:
        nonlocal calls
        calls += 1
        return real(name, segment)

    parts, pattern = ("a",) * 60, ("**", "a") * 20 + ("b",)
    monkeypatch.setattr(globs, "name_matches", counted)
    assert not globs.segments_match(parts, pattern)
    assert globs.segments_match(("a",) * 999 + ("b",), ("**", "b"))  # a deep path: no recursion to run out of
    assert calls <= len(parts) * len(pattern) + 1000
