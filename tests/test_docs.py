"""The documentation holds: the site builds strictly, the README stays a short guide, every product path the docs
name exists in the tree, the README's test command is the one CI runs, and every benchmark's results page is
published."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.services import unavailable

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
README_MAX_BYTES = 15_000
PRODUCT_PREFIXES = ("orchestrator/", "worker/", "benchmarks/", "deploy/", "images/", "skills/", "tests/")
PLACEHOLDER = re.compile(r"[<>*{}$\[\]|]")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
TEST_COMMAND = "```sh\nbash .ci/test\n```"
MODULE_NAME = re.compile(r"\b((?:worker|orchestrator)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
FILE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".json", ".txt")
RESOLVE = """
import importlib, json, sys
missing = []
for name in json.loads(sys.argv[1]):
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:end]))
            break
        except ImportError:
            continue
    try:
        for part in parts[end:]:
            found = getattr(found, part)
    except AttributeError:
        missing.append(name)
print(json.dumps(missing))
"""


def documents() -> list[Path]:
    return [README, REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def product_paths(text: str) -> set[str]:
    """Repository paths written in backticks (outside code blocks) that name a part of the product: the first word of
    an inline code span starting with one of the product's folders, unless it is a pattern (``skills/<name>``)."""
    paths = set()
    for span in INLINE_CODE.findall(FENCE.sub("", text)):
        word = span.split()[0].rstrip(".,:;)") if span.split() else ""
        if word.startswith(PRODUCT_PREFIXES) and not PLACEHOLDER.search(word):
            paths.add(word)
    return paths


def test_the_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        unavailable("mkdocs and mkdocs-material are not installed: install with: pip install -e .[docs]")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_readme_is_a_short_guide():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes; at most {README_MAX_BYTES:,}: move detail to docs/"


def module_names(text: str) -> set[str]:
    """Dotted names of the product written in backticks outside code blocks (``worker.egress.addresses``,
    ``orchestrator.agents.LlmAgent``), leaving out file names (``worker.yaml``)."""
    spans = INLINE_CODE.findall(FENCE.sub("", text))
    return {name for span in spans for name in MODULE_NAME.findall(span) if not name.endswith(FILE_SUFFIXES)}


def test_every_product_path_the_docs_name_exists():
    missing = {}
    for document in documents():
        gone = sorted(path for path in product_paths(document.read_text()) if not (REPO / path.rstrip("/")).exists())
        if gone:
            missing[str(document.relative_to(REPO))] = gone
    assert missing == {}, f"paths named in backticks that are not in the tree: {missing}"


def test_every_module_and_name_the_docs_name_resolves():
    names = sorted({name for document in documents() for name in module_names(document.read_text())})
    assert names, "no module names found: the pattern broke"
    done = subprocess.run([sys.executable, "-c", RESOLVE, json.dumps(names)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    missing = json.loads(done.stdout.splitlines()[-1])
    assert missing == [], f"dotted names in backticks that do not resolve to a module or one of its names: {missing}"


def test_the_path_check_sees_paths_and_skips_patterns():
    text = ("`worker/contract.py` and `images/build.sh [--ca-bundle PATH]`, `skills/<name>`, `tests/*.py`\n"
            "```sh\nworker/not-checked-in-a-block.py\n```\n`worker/gone.py`.")
    assert product_paths(text) == {"worker/contract.py", "images/build.sh", "worker/gone.py"}


def test_the_readme_test_command_is_the_one_ci_runs():
    readme = README.read_text()
    assert TEST_COMMAND in readme, "README's quick start must show `bash .ci/test` in its own sh block"
    assert "bash .ci/setup && .venv/bin/skillrun run " in readme, "README's quick start lost its setup-and-run command"
    ci_run = (REPO / ".ci" / "run").read_text()
    ci_test = (REPO / ".ci" / "test").read_text()
    assert ".ci/test" in ci_run, ".ci/run no longer runs .ci/test, the README's test command"
    assert "bash .ci/setup --test" in ci_test and "pytest" in ci_test, ".ci/test no longer sets up and runs pytest"


def test_every_benchmark_that_publishes_has_its_page_listed():
    results = REPO / "docs" / "benchmarks" / "results"
    listed = (results / "index.md").read_text()
    nav = (REPO / "mkdocs.yml").read_text()
    for script in sorted((REPO / "benchmarks").glob("*.py")):
        for name in re.findall(r'publish\(\s*"([a-z_]+)"', script.read_text()):
            assert name == script.stem, f"{script.name} publishes under another name: {name}"
            assert (results / f"{name}.md").is_file(), f"{script.name} has no results page; run it once"
            assert f"({name}.md)" in listed, f"docs/benchmarks/results/index.md does not list {name}.md"
            assert f"benchmarks/results/{name}.md" in nav, f"mkdocs.yml's nav does not hold {name}.md"


def test_the_architecture_page_names_every_package():
    """Each package of both planes (a folder with an ``__init__.py``, the sandbox skill's excepted) is on the
    architecture page, itself or under a parent the page describes as one line."""
    page = (REPO / "docs" / "internals" / "architecture.md").read_text()
    named = {path.rstrip("/") for path in INLINE_CODE.findall(page) if path.endswith("/")}
    missing = []
    for plane in ("worker", "orchestrator"):
        for init in sorted((REPO / plane).rglob("__init__.py")):
            package = str(init.parent.relative_to(REPO))
            if package == plane or "workspace_skill" in package:
                continue
            parent = str(init.parent.parent.relative_to(REPO))
            if package not in named and (parent == plane or parent not in named):
                missing.append(package)
    assert missing == [], f"packages the architecture page does not describe: {missing}"


def test_the_errors_page_names_every_error_class():
    """Every exception class named in either plane's error tree (``worker/errors.py``, ``orchestrator/errors.py``
    docstrings) is on the errors reference page."""
    page = (REPO / "docs" / "reference" / "errors.md").read_text()
    missing = []
    for tree in ("worker/errors.py", "orchestrator/errors.py"):
        docstring = (REPO / tree).read_text().split('"""')[1]
        for name in re.findall(r"[├└]── (\w+)", docstring):
            if name not in page:
                missing.append(f"{tree}: {name}")
    assert missing == [], f"errors the reference page does not name: {missing}"
