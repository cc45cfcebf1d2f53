"""Reading what a skill declares: each place, merging, and every kind of bad declaration named precisely."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import write_skill
from worker.environments import read_declaration, read_manifest
from worker.environments.manager import DeclarationCache
from worker.errors import DependencyError

PEP723 = '''\
# /// script
# requires-python = ">=3.9"
# dependencies = [
#   "gamma>=1",
# ]
# ///
import gamma
'''


def test_every_place_a_skill_declares_is_read_and_merged_with_the_manifest(tmp_path: Path):
    skill = write_skill(tmp_path, "docs", files={
        "requirements.txt": "# the PDF tools\nalpha>=1.0  # pinned below 2\n\nbeta[fast]==1.0 ; python_version >= '3.8'\n",
        "pyproject.toml": '[project]\nname = "docs"\ndependencies = ["delta<3"]\nrequires-python = ">=3.8"\n',
        "scripts/make.py": PEP723,
        "scripts/plain.py": "print('no metadata')\n",
    })
    (tmp_path / "skillrun.toml").write_text('[skills.docs]\npython = ["alpha<2"]\ndebian = ["poppler-utils"]\n')
    declaration = read_declaration(skill, "docs", read_manifest(tmp_path))
    assert declaration.python == (
        "alpha<2", "alpha>=1.0", 'beta[fast]==1.0; python_version >= "3.8"', "delta<3", "gamma>=1",
    )
    assert declaration.debian == ("poppler-utils",)
    assert declaration.requires_python == ">=3.8,>=3.9"
    assert declaration.sources == ("requirements.txt", "pyproject.toml", "scripts/make.py (PEP 723)", "skillrun.toml")


def test_a_requirements_file_in_the_skills_scripts_is_read_and_a_bad_one_named_by_its_path(tmp_path: Path):
    skill = write_skill(tmp_path, "builder", files={"scripts/requirements.txt": "alpha>=1\n", "requirements.txt": "beta\n"})
    declaration = read_declaration(skill, "builder")
    assert declaration.python == ("alpha>=1", "beta")
    assert declaration.sources == ("requirements.txt", "scripts/requirements.txt")
    (skill / "scripts" / "requirements.txt").write_text("alpha\n-e .\n")
    with pytest.raises(DependencyError, match=r"scripts/requirements.txt line 2: pip options such as '-e'"):
        read_declaration(skill, "builder")


def test_a_skill_that_declares_nothing_needs_nothing(tmp_path: Path):
    skill = write_skill(tmp_path, "plain", files={"scripts/run.sh": "echo hi\n"})
    assert read_declaration(skill, "plain", read_manifest(tmp_path)).empty


@pytest.mark.parametrize(("text", "expected"), [
    ("alpha\n-r other.txt\n", "requirements.txt line 2: pip options such as '-r' are not supported"),
    ("--index-url https://evil.example/simple\nalpha\n", "line 1: pip options such as '--index-url'"),
    ("alpha\nnot a requirement!!\n", "requirements.txt line 2: 'not a requirement!!' is not a valid requirement"),
    ("pkg @ file:///etc/passwd\n", "only https:// URLs may be named"),
    ("pkg @ http://plain.example/pkg.whl\n", "only https:// URLs may be named"),
])
def test_a_bad_requirements_file_is_refused_with_its_line(tmp_path: Path, text: str, expected: str):
    skill = write_skill(tmp_path, "bad", files={"requirements.txt": text})
    with pytest.raises(DependencyError) as caught:
        read_declaration(skill, "bad")
    assert expected in str(caught.value)


@pytest.mark.parametrize(("files", "expected"), [
    ({"pyproject.toml": "[project\n"}, "pyproject.toml: not valid TOML"),
    ({"pyproject.toml": '[project]\ndependencies = "alpha"\n'}, "dependencies: must be a list of strings"),
    ({"pyproject.toml": '[project]\nrequires-python = "three"\n'}, "requires-python 'three' is not a version specifier"),
    ({"s.py": PEP723 + "\n" + PEP723}, "s.py: more than one '# /// script' block"),
    ({"s.py": "# /// script\n# dependencies = [\n# ///\n"}, "s.py: the '# /// script' block is not valid TOML"),
])
def test_a_bad_pyproject_or_inline_block_is_refused_saying_where(tmp_path: Path, files: dict, expected: str):
    skill = write_skill(tmp_path, "bad", files=files)
    with pytest.raises(DependencyError) as caught:
        read_declaration(skill, "bad")
    assert expected in str(caught.value)


@pytest.mark.parametrize(("manifest", "expected"), [
    ("[skills.docs\n", "skillrun.toml: not valid TOML"),
    ("[tools]\nx = 1\n", "unknown table(s) ['tools']"),
    ('[skills.docs]\ncargo = ["x"]\n', "[skills.docs]: unknown key(s) ['cargo']"),
    ('[skills.docs]\nnode = ["Not A Name"]\n', "is not an npm package name"),
    ('[skills.docs]\nnode = ["x@file:../../etc"]\n', "no local paths"),
    ('[skills.docs]\nnode = "docx"\n', "node: must be a list of strings"),
    ('[skills.docs]\ndebian = ["poppler utils; rm -rf /"]\n', "is not a Debian package name"),
    ('[skills.docs]\npython = "alpha"\n', "python: must be a list of strings"),
])
def test_a_bad_manifest_is_refused_saying_what(tmp_path: Path, manifest: str, expected: str):
    (tmp_path / "skillrun.toml").write_text(manifest)
    with pytest.raises(DependencyError) as caught:
        read_manifest(tmp_path)
    assert expected in str(caught.value)


def test_a_package_json_and_the_manifests_node_entries_are_one_node_declaration(tmp_path: Path):
    package = {"name": "docs", "dependencies": {"docx": "^9.0.0", "@scope/tool": "~1.2"},
               "optionalDependencies": {"fsevents": "2"}, "devDependencies": {"jest": "29"},
               "scripts": {"postinstall": "node setup.js"}}
    skill = write_skill(tmp_path, "docs", files={"package.json": json.dumps(package),
                                                 "package-lock.json": '{"lockfileVersion": 3}'})
    (tmp_path / "skillrun.toml").write_text('[skills.docs]\nnode = ["pptxgenjs", "sharp@0.33"]\n')
    declaration = read_declaration(skill, "docs", read_manifest(tmp_path))
    assert declaration.node == ("@scope/tool@~1.2", "docx@^9.0.0", "fsevents@2", "pptxgenjs@latest", "sharp@0.33")
    built = json.loads(declaration.node_package)
    assert built["scripts"] == package["scripts"] and built["devDependencies"] == {"jest": "29"}
    assert built["dependencies"] == {"docx": "^9.0.0", "@scope/tool": "~1.2", "pptxgenjs": "latest", "sharp": "0.33"}
    assert declaration.node_lock == '{"lockfileVersion": 3}'
    assert declaration.sources == ("package.json", "package-lock.json", "skillrun.toml")
    assert not declaration.empty and declaration.python == ()


@pytest.mark.parametrize(("text", "expected"), [
    ("{not json", "package.json: not valid JSON"),
    ("[]", "package.json: must be a JSON object"),
    ('{"dependencies": ["docx"]}', "'dependencies' must be an object"),
    ('{"dependencies": {"docx": "file:../../../etc"}}', "no local paths"),
    ('{"dependencies": {"docx": "github:someone/docx"}}', "no git"),
    ('{"dependencies": {"docx": 9}}', "must be a string"),
    ('{"dependencies": {"../up": "1"}}', "is not an npm package name"),
    ('{"workspaces": ["packages/*"]}', "'workspaces' is not supported"),
])
def test_a_bad_package_json_is_refused_saying_what(tmp_path: Path, text: str, expected: str):
    skill = write_skill(tmp_path, "nodey", files={"package.json": text})
    with pytest.raises(DependencyError) as caught:
        read_declaration(skill, "nodey")
    assert expected in str(caught.value)


def test_a_lock_without_a_package_json_declares_nothing_and_a_bad_lock_is_refused(tmp_path: Path):
    skill = write_skill(tmp_path, "locked", files={"package-lock.json": "{}"})
    assert read_declaration(skill, "locked").empty
    (skill / "package.json").write_text('{"dependencies": {"docx": "9"}}')
    (skill / "package-lock.json").write_text("not a lock")
    with pytest.raises(DependencyError, match="package-lock.json: not a valid lock file"):
        read_declaration(skill, "locked")


def test_a_manifest_naming_a_skill_that_does_not_exist_says_which(tmp_path: Path):
    (tmp_path / "skillrun.toml").write_text('[skills.docs]\npython = ["alpha"]\n[skills.ghost]\npython = ["beta"]\n')
    assert read_manifest(tmp_path).unknown_skills({"docs", "other"}) == ["ghost"]


def test_a_declaration_file_that_is_a_link_is_refused_and_nothing_it_points_at_is_read(tmp_path: Path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-VALUE\n")
    skill = write_skill(tmp_path, "linked")
    os.symlink(secret, skill / "requirements.txt")
    with pytest.raises(DependencyError) as caught:
        read_declaration(skill, "linked")
    assert "links are not followed" in str(caught.value) and "TOP-SECRET" not in str(caught.value)


def test_a_fifo_in_place_of_a_declaration_file_does_not_hang(tmp_path: Path):
    skill = write_skill(tmp_path, "fifo")
    os.mkfifo(skill / "requirements.txt")
    with pytest.raises(DependencyError, match="not a regular file"):
        read_declaration(skill, "fifo")


def test_a_huge_declaration_file_is_refused(tmp_path: Path):
    skill = write_skill(tmp_path, "huge", files={"requirements.txt": "alpha\n" * 300_000})
    with pytest.raises(DependencyError, match="larger than"):
        read_declaration(skill, "huge")


def test_the_cache_reads_a_changed_declaration_again(tmp_path: Path):
    skill = write_skill(tmp_path, "changing", files={"requirements.txt": "alpha\n"})
    cache = DeclarationCache()
    assert cache.get(skill, tmp_path, "changing").python == ("alpha",)
    (skill / "scripts").mkdir()
    (skill / "scripts" / "new.py").write_text(PEP723)
    assert cache.get(skill, tmp_path, "changing").python == ("alpha", "gamma>=1")
    (tmp_path / "skillrun.toml").write_text('[skills.changing]\npython = ["zeta"]\n')
    assert cache.get(skill, tmp_path, "changing").python == ("alpha", "gamma>=1", "zeta")
    (skill / "package.json").write_text('{"dependencies": {"docx": "9"}}')
    assert cache.get(skill, tmp_path, "changing").node == ("docx@9",)


def test_inline_blocks_are_found_as_the_specification_says():
    from worker.environments.declarations import metadata_blocks

    text = (
        "# /// script\n# never closed\nimport os\n"          # an opening with no closing before the code: no block
        "# /// script\n# dependencies = ['a']\n# ///\n"       # a block ...
        "# extra = 1\n# ///\n"                                 # ... that ends at the last closing of its comments
        "x = 1\n# /// other\n# k = 'v'\n# ///\n"
    )
    assert metadata_blocks(text) == [
        ("script", ["# dependencies = ['a']\n", "# ///\n", "# extra = 1\n"]),
        ("other", ["# k = 'v'\n"]),
    ]
