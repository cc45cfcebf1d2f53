"""One skill: ``SKILL.md`` parsing and validation, the ``Tools:`` section, and the skill's docs.

``SKILL.md`` is YAML front matter (``name`` and ``description`` required; ``license``, ``allowed-tools`` and
``metadata`` kept) followed by a Markdown body. The ``Tools:`` section of the body lists the tools the skill
declares::

    Tools:
    - get_current_weather
    - get_weather_forecast: three days ahead      # "- name: text" declares "name"
    # - old_weather_api                           # a line starting with a single '#' is a comment

The section ends at a Markdown heading (``## Usage``) or a plain paragraph. Docs are the skill folder's other
``.md`` and ``.txt`` files.

A ``SKILL.md`` is untrusted input, so what parsing it costs is bounded by its size: the file is read up to
``MAX_SKILL_FILE_BYTES`` and its front matter up to ``MAX_FRONT_MATTER_BYTES``; YAML aliases (``*name``, and so
merge keys) are refused, since a few hundred bytes of nested aliases expand to gigabytes once a value is turned into
text; and the front matter's values are made plain JSON values (dates as ISO text, keys as text), so every reader —
the API, MCP, the console — can serve them; binary values, sets, numbers that are not finite and integers of more
than ``MAX_INTEGER_DIGITS`` digits (which YAML's hexadecimal, octal, binary and sexagesimal forms write in a few
bytes, past Python's limit for turning one into text) are refused.
"""

from __future__ import annotations

import datetime
import errno
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator.errors import SkillValidationError
from worker.names import env_name_problem, parse_entries
from worker.errors import EgressError

SKILL_FILE = "SKILL.md"
SECRETS_KEY = "secrets"
"""The front matter's ``metadata`` key listing the team secrets a skill's commands may be given."""
EGRESS_KEY = "egress"
"""The front matter's ``metadata`` key listing the hosts a skill's commands may reach (``host[:port]`` or
``*.domain[:port]``), within its team's egress allow-list (``orchestrator.egress``)."""
MAX_NAME_LENGTH = 64
MAX_DESCRIPTION_LENGTH = 1024
"""The Agent Skills format's bound on a description: a longer one is a warning (real libraries exceed it), or a
refusal where the operator asks for strict skills (``Settings.strict_skills``)."""
FRONT_MATTER_FIELDS = frozenset({"name", "description", "license", "allowed-tools", "metadata", "compatibility"})
"""The Agent Skills format's front matter fields: another is kept out of the skill, with a warning."""
MAX_DOC_BYTES = 1024 * 1024
MAX_SKILL_FILE_BYTES = 1024 * 1024
"""The largest ``SKILL.md`` read (front matter and body)."""
MAX_FRONT_MATTER_BYTES = 64 * 1024
"""The largest front matter parsed (a few hundred bytes is usual)."""
MAX_INTEGER_DIGITS = 4300
"""The most decimal digits of an integer in front matter: Python's default limit for turning an integer into text
(``sys.int_info.default_max_str_digits``), which the loader applies to decimal integers only."""
_INTEGER_BOUND = 10**MAX_INTEGER_DIGITS
DOC_SUFFIXES = (".md", ".txt")
NAME_PATTERN = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_TOOLS_HEADER = re.compile(r"^\s*(?:#{1,6}\s*)?\**Tools\**:?\**\s*$", re.IGNORECASE)
_LIST_ITEM = re.compile(r"^\s*[-*+]\s+(.*)$")
_TOOL_NAME = re.compile(r"^`?([A-Za-z_][\w.-]*)`?")


@dataclass(frozen=True)
class SkillSummary:
    """The overview tier: what every model request carries about a skill; and what its front matter does that the
    Agent Skills format does not allow, which public libraries do (``warnings``: field and message each), shown to
    the people who look at the skill, never to the model."""

    name: str
    description: str
    warnings: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SkillDoc:
    """A doc file of a skill, by its path relative to the skill folder."""

    name: str
    content: str


@dataclass(frozen=True)
class Skill:
    """A parsed skill: summary, body, declared tools, docs and where it lives."""

    summary: SkillSummary
    body: str
    tools: list[str]
    docs: list[SkillDoc]
    path: Path
    root: Path
    license: str | None = None
    allowed_tools: list[str] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.summary.name

    @property
    def description(self) -> str:
        return self.summary.description

    @property
    def secrets(self) -> list[str]:
        """The team secrets the skill's commands may be given (``metadata.secrets`` in its front matter)."""
        return list(self.metadata.get(SECRETS_KEY, []))

    @property
    def egress(self) -> list[str]:
        """The hosts the skill's commands may reach, within its team's allow-list (``metadata.egress``)."""
        return list(self.metadata.get(EGRESS_KEY, []))

    @property
    def doc_names(self) -> list[str]:
        return [doc.name for doc in self.docs]

    def doc(self, name: str) -> SkillDoc | None:
        return next((doc for doc in self.docs if doc.name == name), None)


def _check_secrets(declared: object, path: str) -> None:
    if not isinstance(declared, list) or not all(isinstance(name, str) for name in declared):
        raise SkillValidationError(path, f"metadata.{SECRETS_KEY}", "must be a list of secret names")
    for name in declared:
        problem = env_name_problem(name)
        if problem is not None:
            raise SkillValidationError(path, f"metadata.{SECRETS_KEY}", problem)


def _check_egress(declared: object, path: str) -> None:
    if not isinstance(declared, list) or not all(isinstance(entry, str) for entry in declared):
        raise SkillValidationError(path, f"metadata.{EGRESS_KEY}", "must be a list of hosts (host[:port] or "
                                                                 "*.domain[:port])")
    try:
        parse_entries(declared, "the skill's egress declaration")
    except EgressError as exc:
        raise SkillValidationError(path, f"metadata.{EGRESS_KEY}", str(exc)) from None


def read_regular_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``path`` (one more than ``limit`` says it is larger). Opened
    without blocking, so a FIFO, a device or a folder put where a file was expected is refused (``OSError``,
    ``EINVAL``) instead of read for ever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        # read(n) makes an n-byte buffer first: ask for the file's size, and read on only if it grew since
        expected = min(info.st_size, limit)
        data = file.read(expected + 1)
        if len(data) > expected:
            data += file.read(limit + 1 - len(data))
        return data


def read_skill_file(skill_file: Path) -> str:
    """The text of a ``SKILL.md``, read up to ``MAX_SKILL_FILE_BYTES``; ``SkillValidationError`` when it is larger,
    not UTF-8, not a regular file or cannot be read."""
    path = str(skill_file)
    try:
        data = read_regular_file(skill_file, MAX_SKILL_FILE_BYTES)
    except OSError as exc:
        raise SkillValidationError(path, "file", f"cannot be read: {exc.strerror}") from exc
    if len(data) > MAX_SKILL_FILE_BYTES:
        raise SkillValidationError(path, "file", f"is larger than {MAX_SKILL_FILE_BYTES} bytes; keep long material "
                                                 "in the skill's docs")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SkillValidationError(path, "encoding", "SKILL.md must be UTF-8 text") from exc


def split_front_matter(text: str, path: str) -> tuple[dict, str]:
    """Return (front matter mapping, body) of a ``SKILL.md`` text (bounded as the module's description says)."""
    text = text.removeprefix("\ufeff")
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise SkillValidationError(path, "front matter", "SKILL.md must start with a '---' line and YAML front matter")
    for index in range(1, len(lines)):
        if lines[index].strip() == "---":
            header, body = "".join(lines[1:index]), "".join(lines[index + 1 :])
            break
    else:
        raise SkillValidationError(path, "front matter", "the front matter has no closing '---' line")
    size = len(header.encode("utf-8", "surrogatepass"))
    if size > MAX_FRONT_MATTER_BYTES:
        raise SkillValidationError(path, "front matter", f"is {size} bytes; at most {MAX_FRONT_MATTER_BYTES} are "
                                                         "allowed (keep long material in the body or the docs)")
    simple = _simple_front_matter(header)
    if simple is not None:
        return _plain(simple, path), body
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when PyYAML was built with it
    try:
        # events only: an alias is refused before it is expanded (a text without "*" has no alias to look for)
        for event in yaml.parse(header, Loader=loader) if "*" in header else ():
            if isinstance(event, yaml.AliasEvent):
                line = f" (line {event.start_mark.line + 2})" if event.start_mark is not None else ""
                raise SkillValidationError(path, "front matter", f"YAML aliases are not allowed{line}: write the "
                                                                 "value out where it is used")
        data = yaml.load(header, Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 2})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SkillValidationError(path, "front matter", f"malformed YAML{where}: {problem}") from exc
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        # a scalar its tag or shape promises but its text is not (``2024-13-45``, ``!!int 0x``, 5,000 digits)
        raise SkillValidationError(path, "front matter", f"malformed YAML: a value cannot be read ({exc})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SkillValidationError(path, "front matter", "the front matter must be a YAML mapping of fields")
    return _plain(data, path), body


# what YAML reads as text within a line: printable, less its line breaks (U+2028, U+2029) and the BOM
_PRINTABLE = "\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff"
_SIMPLE_LINE = re.compile(
    f"([A-Za-z][A-Za-z0-9_-]*): ((?![\\s\\-?:,\\[\\]{{}}#&*!|>'\"%@`])[{_PRINTABLE}]+)\n"
)
_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVER = yaml.resolver.Resolver()


def _simple_front_matter(header: str) -> dict | None:
    """The mapping of a front matter made only of ``key: text`` lines, or ``None`` for anything else (which the YAML
    loader reads). Most front matters are like this, and a YAML load costs ten times as much. Each line's key and
    value must be plain scalars that YAML resolves to text (``yes``, ``1.0`` or ``null`` are not), on one line, with
    nothing YAML reads otherwise: no indicator first, no ``: `` or `` #`` inside, no trailing space or colon."""
    data: dict = {}
    for line in header.splitlines(keepends=True):
        match = _SIMPLE_LINE.fullmatch(line)
        if match is None:
            return None
        key, value = match.groups()
        if ": " in value or " #" in value or value[-1] in " :" or any(
            _RESOLVER.resolve(yaml.ScalarNode, scalar, (True, False)) != _STR_TAG for scalar in (key, value)
        ):
            return None
        data[key] = value
    return data or None


def _plain(data: dict, path: str) -> dict:
    """``data`` with every value a JSON value: dates and times as ISO text, mapping keys as text; a value of
    another kind (binary, a set, a number that is not finite) refused, naming where it is. Walked without
    recursion (the pure-Python loader nests as deep as the text does)."""
    top: dict = {}
    pending: list[tuple[dict | list, dict | list, str]] = [(data, top, "")]
    while pending:
        source, target, where = pending.pop()
        if isinstance(source, dict):
            items = [(_key(key, where, path), value) for key, value in source.items()]
        else:
            items = list(enumerate(source))
        for key, value in items:
            at = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else key
            if isinstance(value, (dict, list)):
                inner, value = value, {} if isinstance(value, dict) else []
                pending.append((inner, value, at))
            else:
                value = _scalar(value, at, path)
            if isinstance(target, dict):
                target[key] = value
            else:
                target.append(value)
    return top


def _key(key: object, where: str, path: str) -> str:
    """A mapping key as text, as JSON writes one (``1``, ``true``, ``null``, a date's ISO text); a key that cannot be
    one is refused as the front matter's key in ``where``."""
    key = _scalar(key, f"front matter key in {where}" if where else "front matter key", path)
    if isinstance(key, str):
        return key
    return "null" if key is None else str(key).lower() if isinstance(key, bool) else str(key)


def _scalar(value: object, where: str, path: str) -> object:
    """``value`` as a JSON value every reader can write as text, or ``SkillValidationError`` naming ``where``."""
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        raise SkillValidationError(path, where, "is not a finite number")
    if isinstance(value, int) and abs(value) >= _INTEGER_BOUND:
        raise SkillValidationError(path, where, f"is an integer of more than {MAX_INTEGER_DIGITS} digits")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    kind = {bytes: "binary data (!!binary)", set: "a set (!!set)"}.get(type(value), type(value).__name__)
    raise SkillValidationError(path, where, f"is {kind}; front matter values are text, numbers, booleans, lists "
                                            "and mappings")


def validate_summary(data: dict, path: str) -> SkillSummary:
    name = data.get("name")
    if name is None or (isinstance(name, str) and not name.strip()):
        raise SkillValidationError(path, "name", "is required")
    if not isinstance(name, str):
        raise SkillValidationError(path, "name", "must be a string")
    if len(name) > MAX_NAME_LENGTH:
        raise SkillValidationError(path, "name", f"is {len(name)} characters; at most {MAX_NAME_LENGTH} are allowed")
    if not NAME_PATTERN.fullmatch(name):
        raise SkillValidationError(
            path, "name", f"{name!r} may only use lowercase letters, digits and single hyphens between them"
        )
    description = data.get("description")
    if description is None or (isinstance(description, str) and not description.strip()):
        raise SkillValidationError(path, "description", "is required", skill=name)
    if not isinstance(description, str):
        raise SkillValidationError(path, "description", "must be a string", skill=name)
    if len(description) > MAX_FRONT_MATTER_BYTES:  # none parsed is: a summary read back from a cache file
        raise SkillValidationError(path, "description", f"is {len(description)} characters, more than a front "
                                                        "matter holds", skill=name)
    warnings = []
    if len(description) > MAX_DESCRIPTION_LENGTH:
        warnings.append(("description", f"is {len(description)} characters; the Agent Skills format allows "
                                        f"{MAX_DESCRIPTION_LENGTH}, and every model request carries it"))
    unknown = sorted(set(data) - FRONT_MATTER_FIELDS)
    if unknown:
        warnings.append(("front matter", f"{', '.join(map(repr, unknown))} "
                                         f"{'is not a field' if len(unknown) == 1 else 'are not fields'} of the "
                                         "Agent Skills format; kept out of the skill"))
    return SkillSummary(name=name, description=description.strip(), warnings=tuple(warnings))


def parse_tools(body: str) -> list[str]:
    """The tool names of the body's ``Tools:`` section (see the module docstring for the grammar)."""
    tools: list[str] = []
    in_section = in_fence = False
    for line in body.splitlines():
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            in_fence = not in_fence
            if in_section:
                break
            continue
        if in_fence:
            continue
        if not in_section:
            in_section = bool(_TOOLS_HEADER.match(line))
            continue
        if not stripped:
            continue
        if stripped.startswith("#"):
            if stripped.startswith("##"):
                break  # a Markdown heading ends the section
            continue  # a '# ...' line is a comment
        item = _LIST_ITEM.match(line)
        if item is None:
            break  # a plain paragraph ends the section
        name = _TOOL_NAME.match(item.group(1).strip())
        if name and name.group(1) not in tools:
            tools.append(name.group(1))
    return tools


def list_docs(skill_dir: Path) -> list[Path]:
    """The doc files of a skill folder: every ``.md``/``.txt`` but ``SKILL.md``, hidden folders skipped, and links
    that lead out of the folder skipped too (a doc is read and shown to models and MCP clients: a link to a host
    file must not make it one)."""
    found: list[Path] = []
    inside = os.path.realpath(skill_dir)
    for dirpath, dirnames, filenames in os.walk(skill_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for filename in sorted(filenames):
            path = Path(dirpath) / filename
            if filename.startswith(".") or not filename.lower().endswith(DOC_SUFFIXES):
                continue
            if path.parent == skill_dir and filename == SKILL_FILE:
                continue
            if path.is_symlink() and os.path.commonpath([inside, os.path.realpath(path)]) != inside:
                continue
            if path.is_file():  # not a FIFO or a device named like a doc
                found.append(path)
    return found


def load_skill(skill_dir: Path, root: Path) -> Skill:
    """Parse and validate the skill in ``skill_dir``; raise ``SkillValidationError`` naming file and field."""
    skill_file = skill_dir / SKILL_FILE
    path = str(skill_file)
    inside = os.path.realpath(skill_dir)
    if os.path.commonpath([inside, os.path.realpath(skill_file)]) != inside:
        raise SkillValidationError(path, "file", "is a link out of the skill's folder")
    data, body = split_front_matter(read_skill_file(skill_file), path)
    summary = validate_summary(data, path)
    allowed = data.get("allowed-tools") or []
    if isinstance(allowed, str):
        allowed = allowed.replace(",", " ").split()
    if not isinstance(allowed, list) or not all(isinstance(t, str) for t in allowed):
        raise SkillValidationError(path, "allowed-tools", "must be a list of tool names or a space-separated string")
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise SkillValidationError(path, "metadata", "must be a mapping")
    _check_secrets(metadata.get(SECRETS_KEY, []), path)
    _check_egress(metadata.get(EGRESS_KEY, []), path)
    license_ = data.get("license")
    docs = []
    for doc_path in list_docs(skill_dir):
        name = doc_path.relative_to(skill_dir).as_posix()
        try:
            content = read_regular_file(doc_path, MAX_DOC_BYTES)
        except OSError as exc:
            raise SkillValidationError(str(doc_path), "doc", f"{name} cannot be read: {exc.strerror}") from exc
        if len(content) > MAX_DOC_BYTES:
            raise SkillValidationError(str(doc_path), "doc", f"{name} is larger than {MAX_DOC_BYTES} bytes")
        text = content.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads
        docs.append(SkillDoc(name=name, content=text))
    return Skill(
        summary=summary,
        body=body.strip("\n"),
        tools=parse_tools(body),
        docs=docs,
        path=skill_dir,
        root=root,
        license=None if license_ is None else str(license_),
        allowed_tools=list(allowed),
        metadata=metadata,
    )
