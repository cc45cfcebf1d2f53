"""What a skill says it needs: Python packages, Node packages and Debian packages.

A skill declares its Python dependencies in any of three places, all merged:

* ``requirements.txt`` in the skill folder or its ``scripts/``: one PEP 508 requirement per line (``pypdf>=4``,
  ``openpyxl[charts]``, ``name @ https://...``); comments and blank lines are skipped; pip's options
  (``-r``, ``--index-url``, ``-e``...) are refused, since the index is the operator's choice;
* ``pyproject.toml`` in the skill folder: ``[project] dependencies`` (and ``requires-python``);
* PEP 723 inline metadata (a ``# /// script`` block with ``dependencies = [...]``) in any ``.py`` file of the
  skill folder.

Its Node dependencies are its ``package.json`` (``dependencies`` and ``optionalDependencies``; the file is built
as it is, scripts included, with its ``package-lock.json`` when there is one). Dependencies are named as npm names
them (a version range, a tag, an ``npm:`` alias or an ``https://`` tarball); local paths and git sources are refused,
since a build sees only the package registry.

A library that is mirrored rather than owned declares the same in one manifest at its root, ``skillrun.toml``
(``MANIFEST_FILE``)::

    [skills.pdf]
    python = ["pypdf>=4", "reportlab"]
    node = ["docx@^9", "@scope/name@1.2.3"]
    debian = ["poppler-utils"]

What the skill's own files and the manifest say is merged; a conflict between them is the resolver's to report.
Every file is read with a size bound and every requirement is checked before anything is resolved.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from worker.errors import DependencyError

MANIFEST_FILE = "skillrun.toml"
REQUIREMENTS_FILE = "requirements.txt"
REQUIREMENTS_FILES = (REQUIREMENTS_FILE, f"scripts/{REQUIREMENTS_FILE}")
"""Where a skill's requirements files are read, relative to its folder (a skill's scripts often keep theirs)."""
PYPROJECT_FILE = "pyproject.toml"
PACKAGE_FILE = "package.json"
PACKAGE_LOCK_FILE = "package-lock.json"
MAX_PACKAGE_LOCK_BYTES = 16 * 1024 * 1024
"""The largest ``package-lock.json`` read (a large application's lock is a few MiB)."""
DECLARATION_FILES = (REQUIREMENTS_FILE, PYPROJECT_FILE, PACKAGE_FILE, PACKAGE_LOCK_FILE)
"""The names of the files (besides ``.py`` scripts) a declaration is read from."""
NODE_PACKAGE = re.compile(r"^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$")
"""An npm package name: lowercase, URL-safe, optionally in a scope."""
REFUSED_NODE_SOURCES = ("file:", "link:", "git:", "git+", "github:", "gitlab:", "bitbucket:", "gist:", "http:")
MAX_DECLARATION_BYTES = 1024 * 1024
"""The largest declaration file read (a requirements file, a pyproject, a script scanned for PEP 723)."""
MAX_SCRIPTS = 500
"""The most ``.py`` files of one skill scanned for inline metadata."""
MAX_REQUIREMENTS = 500
DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]{0,61}[a-z0-9+.]")
"""A Debian package's name (matched whole), never ending in ``-``: apt would read ``name-`` as "remove name"."""
MAX_DEBIAN_PACKAGES = 256
"""The most Debian packages one skill may declare (they are named to the build on one command line)."""
PEP723_OPENING = re.compile(r"^# /// (?P<type>[a-zA-Z0-9-]+)$")
PEP723_CLOSING = "# ///"
SKIPPED_FOLDERS = {".git", "__pycache__", "node_modules", ".venv", "venv"}


@dataclass(frozen=True)
class Declaration:
    """Everything one skill needs, merged from its files and its library's manifest."""

    python: tuple[str, ...] = ()
    """PEP 508 requirements, normalised, sorted and without duplicates."""
    debian: tuple[str, ...] = ()
    requires_python: str | None = None
    sources: tuple[str, ...] = ()
    """Where the requirements came from (files relative to the skill folder, or the manifest)."""
    node: tuple[str, ...] = ()
    """Node dependencies as ``name@spec``, sorted (what ``node_package`` depends on)."""
    node_package: str | None = None
    """The ``package.json`` a Node build installs (the skill's, with the manifest's ``node`` entries added), or
    ``None`` when it declares no Node dependency."""
    node_lock: str | None = None
    """The skill's ``package-lock.json``, installed exactly (``npm ci``) when present."""

    @property
    def empty(self) -> bool:
        return not self.python and not self.debian and self.node_package is None


@dataclass(frozen=True)
class Manifest:
    """A library's ``skillrun.toml``: skill name → its Python, Node and Debian packages."""

    python: dict[str, tuple[str, ...]] = field(default_factory=dict)
    debian: dict[str, tuple[str, ...]] = field(default_factory=dict)
    node: dict[str, dict[str, str]] = field(default_factory=dict)
    """Skill name → Node package name → its spec (``latest`` when none was given)."""

    @property
    def skills(self) -> set[str]:
        return set(self.python) | set(self.debian) | set(self.node)

    def unknown_skills(self, names: set[str]) -> list[str]:
        """The skills the manifest names that are not among ``names`` (a mistake the library's owner must hear of)."""
        return sorted(self.skills - names)


def read_manifest(root: Path) -> Manifest | None:
    """The manifest at a library's root, or ``None`` when it has none. ``DependencyError`` says what is wrong."""
    path = root / MANIFEST_FILE
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = tomllib.loads(_read(path, MANIFEST_FILE))
    except tomllib.TOMLDecodeError as exc:
        raise DependencyError(f"{MANIFEST_FILE}: not valid TOML ({exc})") from exc
    unknown = set(data) - {"skills"}
    if unknown:
        raise DependencyError(f"{MANIFEST_FILE}: unknown table(s) {sorted(unknown)}; only [skills.<name>] is read")
    skills = data.get("skills", {})
    if not isinstance(skills, dict):
        raise DependencyError(f"{MANIFEST_FILE}: 'skills' must be a table of [skills.<name>] tables")
    manifest = Manifest()
    for name, entry in skills.items():
        where = f"{MANIFEST_FILE} [skills.{name}]"
        if not isinstance(entry, dict):
            raise DependencyError(f"{where}: must be a table with 'python', 'node' and/or 'debian' lists")
        extra = set(entry) - {"python", "node", "debian"}
        if extra:
            raise DependencyError(f"{where}: unknown key(s) {sorted(extra)}; use 'python', 'node' and 'debian'")
        python = _string_list(entry.get("python", []), f"{where} python")
        manifest.python[name] = tuple(_requirement(text, f"{where} python") for text in python)
        debian = _string_list(entry.get("debian", []), f"{where} debian")
        if len(debian) > MAX_DEBIAN_PACKAGES:
            raise DependencyError(f"{where} debian: {len(debian)} packages; at most {MAX_DEBIAN_PACKAGES}")
        for package in debian:
            if not DEBIAN_PACKAGE.fullmatch(package):
                raise DependencyError(f"{where} debian: {package!r} is not a Debian package name")
        manifest.debian[name] = tuple(debian)
        if "node" in entry:
            manifest.node[name] = dict(
                node_dependency(text, f"{where} node") for text in _string_list(entry["node"], f"{where} node"))
    return manifest


def read_declaration(skill_dir: Path, name: str, manifest: Manifest | None = None) -> Declaration:
    """What the skill in ``skill_dir`` (called ``name``) needs, with its library's ``manifest`` merged in."""
    python: list[str] = []
    sources: list[str] = []
    requires_python: list[str] = []
    for relative in REQUIREMENTS_FILES:
        requirements = skill_dir / relative
        if _present(requirements):
            python += parse_requirements(_read(requirements, relative), relative)
            sources.append(relative)
    pyproject = skill_dir / PYPROJECT_FILE
    if _present(pyproject):
        found, needs = _pyproject(_read(pyproject, PYPROJECT_FILE))
        python += found
        requires_python += [needs] if needs else []
        sources.append(PYPROJECT_FILE)
    for script in _scripts(skill_dir):
        relative = script.relative_to(skill_dir).as_posix()
        metadata = inline_metadata(_read(script, relative), relative)
        if metadata is not None:
            found, needs = metadata
            python += found
            requires_python += [needs] if needs else []
            sources.append(f"{relative} (PEP 723)")
    package, lock = _package(skill_dir, sources)
    debian: tuple[str, ...] = ()
    if manifest is not None and name in manifest.skills:
        python += manifest.python.get(name, ())
        debian = tuple(sorted(set(manifest.debian.get(name, ()))))
        if name in manifest.node:
            package = package if package is not None else {"name": "skillrun-node-environment", "private": True}
            package["dependencies"] = {**package.get("dependencies", {}), **manifest.node[name]}
        sources.append(MANIFEST_FILE)
    merged = tuple(sorted(set(python)))
    if len(merged) > MAX_REQUIREMENTS:
        raise DependencyError(f"skill {name!r} declares {len(merged)} requirements; at most {MAX_REQUIREMENTS}")
    node: tuple[str, ...] = ()
    if package is not None:
        wanted = {**package.get("optionalDependencies", {}), **package.get("dependencies", {})}
        if len(wanted) > MAX_REQUIREMENTS:
            raise DependencyError(f"skill {name!r} declares {len(wanted)} Node dependencies; at most {MAX_REQUIREMENTS}")
        node = tuple(sorted(f"{package_name}@{spec}" for package_name, spec in wanted.items()))
    return Declaration(merged, debian, ",".join(sorted(set(requires_python))) or None, tuple(sources), node,
                       None if package is None else json.dumps(package, indent=2, sort_keys=True) + "\n", lock)


def node_dependency(text: str, where: str) -> tuple[str, str]:
    """``name@spec`` (or a bare ``name``: ``latest``) as a name and a spec npm may install from the registry;
    ``DependencyError`` for anything else."""
    text = text.strip()
    at = text.find("@", 1)
    package_name, spec = (text, "latest") if at < 0 else (text[:at], text[at + 1:].strip() or "latest")
    _check_node(package_name, spec, where)
    return package_name, spec


def _check_node(package_name: object, spec: object, where: str) -> None:
    if not isinstance(package_name, str) or not NODE_PACKAGE.fullmatch(package_name) or len(package_name) > 214:
        raise DependencyError(f"{where}: {package_name!r} is not an npm package name")
    _check_spec(package_name, spec, where)


def _check_spec(package_name: str, spec: object, where: str) -> None:
    """``DependencyError`` unless ``spec`` is one npm takes from the registry: a version or range, a tag, an
    ``npm:`` alias or an ``https://`` tarball (npm reads a spec that starts with ``.``, ``/``, ``~/`` or a drive
    letter, or ends in ``.tgz``, ``.tar.gz`` or ``.tar``, as a local path; one with a ``/`` as a git host's)."""
    if not isinstance(spec, str) or len(spec) > 1024 or any(ord(c) < 32 or c == "\\" for c in spec):
        raise DependencyError(f"{where}: the version of {package_name!r} must be a string such as '^9.1.0'")
    lowered = spec.strip().lower()
    remote = lowered.startswith(("https://", "npm:"))
    if lowered.startswith(REFUSED_NODE_SOURCES) or lowered.startswith((".", "/")) or (
            "/" in lowered and not remote) or (not remote and (
            re.match(r"[a-z]:", lowered) or re.search(r"\.(tgz|tar\.gz|tar)$", lowered))):
        raise DependencyError(
            f"{where}: {package_name!r}@{spec!r}: only versions, tags, npm: aliases and https:// tarballs may be "
            "named (a build reaches the package registry alone: no local paths, no git)"
        )


def _check_overrides(value: object, where: str) -> None:
    """Every version an ``overrides`` table names (at any depth; ``$name`` refers to a dependency's own)."""
    pending = [value]
    while pending:
        table = pending.pop()
        if not isinstance(table, dict):
            raise DependencyError(f"{where}: must be an object of package names and versions")
        for key, item in table.items():
            if isinstance(item, dict):
                pending.append(item)
            elif not (isinstance(item, str) and item.startswith("$")):
                _check_spec(str(key), item, where)


def _package(skill_dir: Path, sources: list[str]) -> tuple[dict | None, str | None]:
    """The skill's ``package.json`` as an object (its dependencies checked) and its ``package-lock.json`` text;
    ``(None, None)`` without a ``package.json`` (a lock alone declares nothing)."""
    path = skill_dir / PACKAGE_FILE
    if not _present(path):
        return None, None
    try:
        package = json.loads(_read(path, PACKAGE_FILE))
    except (ValueError, RecursionError) as exc:
        raise DependencyError(f"{PACKAGE_FILE}: not valid JSON ({type(exc).__name__}: nested too deep or "
                              f"malformed)" if isinstance(exc, RecursionError) else
                              f"{PACKAGE_FILE}: not valid JSON ({exc})") from None
    if not isinstance(package, dict):
        raise DependencyError(f"{PACKAGE_FILE}: must be a JSON object")
    if "overrides" in package:
        _check_overrides(package["overrides"], f"{PACKAGE_FILE} overrides")
    for table in ("dependencies", "optionalDependencies", "devDependencies", "peerDependencies"):
        entries = package.get(table, {})
        if not isinstance(entries, dict):
            raise DependencyError(f"{PACKAGE_FILE}: {table!r} must be an object of package names and versions")
        for package_name, spec in entries.items():
            _check_node(package_name, spec, f"{PACKAGE_FILE} {table}")
    for table in ("bundleDependencies", "bundledDependencies", "workspaces"):
        if package.get(table):
            raise DependencyError(f"{PACKAGE_FILE}: {table!r} is not supported (a build installs from the registry)")
    sources.append(PACKAGE_FILE)
    lock_path = skill_dir / PACKAGE_LOCK_FILE
    if not _present(lock_path):
        return package, None
    lock = read_plain_file(lock_path, MAX_PACKAGE_LOCK_BYTES, PACKAGE_LOCK_FILE, DependencyError)
    try:
        if not isinstance(json.loads(lock), dict):
            raise ValueError("not an object")
    except (ValueError, RecursionError) as exc:
        reason = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise DependencyError(f"{PACKAGE_LOCK_FILE}: not a valid lock file ({reason})") from None
    sources.append(PACKAGE_LOCK_FILE)
    return package, lock


def parse_requirements(text: str, where: str) -> list[str]:
    """The requirements of a requirements file: PEP 508 lines; options refused with the line that holds them."""
    found = []
    for number, line in _logical_lines(text):
        if line.startswith("-"):
            option = line.split()[0]
            raise DependencyError(
                f"{where} line {number}: pip options such as {option!r} are not supported; list one package per "
                "line (the package index is the operator's setting)"
            )
        found.append(_requirement(line, f"{where} line {number}"))
    return found


def inline_metadata(text: str, where: str) -> tuple[list[str], str | None] | None:
    """A script's PEP 723 ``script`` block: its dependencies and ``requires-python``; ``None`` when it has none."""
    blocks = [lines for kind, lines in metadata_blocks(text) if kind == "script"]
    if not blocks:
        return None
    if len(blocks) > 1:
        raise DependencyError(f"{where}: more than one '# /// script' block (PEP 723 allows one)")
    content = "".join(line[2:] if line.startswith("# ") else line[1:] for line in blocks[0])
    try:
        data = tomllib.loads(content)
    except tomllib.TOMLDecodeError as exc:
        raise DependencyError(f"{where}: the '# /// script' block is not valid TOML ({exc})") from exc
    dependencies = _string_list(data.get("dependencies", []), f"{where} dependencies")
    return [_requirement(text, f"{where} dependencies") for text in dependencies], _python_spec(
        data.get("requires-python"), where
    )


def metadata_blocks(text: str) -> list[tuple[str, list[str]]]:
    """PEP 723 blocks of a script, each its type and its comment lines (with their line ends), found in one pass.

    As the specification's regular expression has it: a block opens with ``# /// TYPE``, holds comment lines
    (``#`` or ``# ...``) and ends at the last ``# ///`` before the first line that is not a comment. A run of
    comment lines is looked through once whatever it holds (the regular expression, on lines of openings that are
    never closed, takes time that grows with the square of the file)."""
    lines = text.splitlines(keepends=True)
    blocks: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(lines):
        opening = PEP723_OPENING.match(lines[i].rstrip("\r\n"))
        if opening is None:
            i += 1
            continue
        closing, j = None, i + 1
        while j < len(lines) and _is_comment(lines[j]):
            if lines[j].rstrip("\r\n") == PEP723_CLOSING:
                closing = j
            j += 1
        if closing is None:
            i = j  # no opening in this run of comments closes either
            continue
        blocks.append((opening.group("type"), lines[i + 1:closing]))
        i = closing + 1
    return blocks


def _is_comment(line: str) -> bool:
    bare = line.rstrip("\r\n")
    return bare == "#" or bare.startswith("# ")


def _pyproject(text: str) -> tuple[list[str], str | None]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DependencyError(f"{PYPROJECT_FILE}: not valid TOML ({exc})") from exc
    project = data.get("project", {})
    if not isinstance(project, dict):
        raise DependencyError(f"{PYPROJECT_FILE}: [project] must be a table")
    where = f"{PYPROJECT_FILE} [project] dependencies"
    dependencies = _string_list(project.get("dependencies", []), where)
    return [_requirement(text, where) for text in dependencies], _python_spec(project.get("requires-python"), PYPROJECT_FILE)


def _requirement(text: str, where: str) -> str:
    """``text`` as a normalised PEP 508 requirement; local paths and non-https URLs are refused."""
    try:
        requirement = Requirement(text.strip())
    except InvalidRequirement as exc:
        raise DependencyError(f"{where}: {text.strip()!r} is not a valid requirement ({exc})") from exc
    if requirement.url is not None and not requirement.url.startswith("https://"):
        raise DependencyError(f"{where}: {text.strip()!r}: only https:// URLs may be named (no local paths)")
    return str(requirement)


def _python_spec(value: object, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise DependencyError(f"{where}: requires-python must be a string such as '>=3.10'")
    try:
        return str(SpecifierSet(value))
    except InvalidSpecifier as exc:
        raise DependencyError(f"{where}: requires-python {value!r} is not a version specifier") from exc


def _string_list(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise DependencyError(f"{where}: must be a list of strings")
    return value


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Non-empty lines without comments, continuation lines joined, each with the number it starts on."""
    lines: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            lines.append((start, line))
    if pending.strip():
        lines.append((start, pending.strip()))
    return lines


def _scripts(skill_dir: Path) -> list[Path]:
    """The skill's ``.py`` files (not following links, not in hidden or environment folders), at most
    ``MAX_SCRIPTS``."""
    found: list[Path] = []
    pending = [skill_dir]
    while pending:
        folder = pending.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink() or entry.name.startswith(".") and entry.is_dir():
                continue
            if entry.is_dir():
                if entry.name not in SKIPPED_FOLDERS:
                    pending.append(entry)
            elif entry.suffix == ".py" and entry.is_file():
                found.append(entry)
                if len(found) > MAX_SCRIPTS:
                    raise DependencyError(f"more than {MAX_SCRIPTS} .py files to scan for PEP 723 metadata")
    return sorted(found)


def _present(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _read(path: Path, where: str) -> str:
    """A declaration file's text, bounded; a link (which could point anywhere on the worker's host), a FIFO or a
    device is refused."""
    return read_plain_file(path, MAX_DECLARATION_BYTES, where, DependencyError)


def read_plain_file(path: Path, limit: int, where: str, error: type[DependencyError]) -> str:
    """The text of the regular file at ``path``, at most ``limit`` bytes, opened without following a link and
    without blocking on a FIFO (it may have been planted by a skill or a build: read as root, a link could lead
    anywhere on the host); ``error`` saying ``where`` what is wrong otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"{where}: cannot be read ({exc.strerror}; links are not followed)") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before a file object is made of it (a folder cannot be)
        os.close(fd)
        raise error(f"{where}: not a regular file")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise error(f"{where}: larger than {limit} bytes")
    return data.decode("utf-8", errors="replace")


__all__ = [
    "DECLARATION_FILES",
    "MANIFEST_FILE",
    "Declaration",
    "Manifest",
    "inline_metadata",
    "node_dependency",
    "parse_requirements",
    "read_plain_file",
    "read_declaration",
    "read_manifest",
]
