"""The file operations behind ``Read``, ``Write``, ``Edit``, ``Grep`` and ``Glob``, confined to one root folder.

Standard library only, and no import of either plane but the glob module (``worker.collect.globs``, standard library
only too, for ``Glob``): host mode calls these functions in a thread; workspace mode runs this very file inside the
session's sandbox (it is the script of the empty skill its runs stage, beside its ``SKILL.md``), and ``Glob`` (or any
operation, with a library skill staged instead) runs this file's text after the glob module's (``workspace.py``), so
both modes share one implementation, its limits and its answers, and Glob reads a pattern as output collection does. Every answer is the guide's dict: ``{"success": True,
...}`` or ``{"success": False, "error": "..."}``.

A path is relative to the root, or absolute inside it. It is refused when it leaves the root: ``..``, an absolute path
elsewhere, a symlink (of the file or of any folder above it) pointing out — the check is on the fully resolved path.
"""

from __future__ import annotations

import json
import os
import re
import sys

if __name__ != "__main__":  # on the host; in a sandbox, Glob runs this text after the glob module's (workspace.py)
    from worker.collect import expand_braces, segments_match

MAX_READ_BYTES = 10 * 1024 * 1024
"""Read refuses a file larger than this (the guide's 10 MB); Grep skips such files."""
MAX_READ_LINES = 10_000
"""Lines one Read returns at most (the guide's 10 000); the answer says when it stopped there."""
MAX_WRITE_BYTES = 10 * 1024 * 1024
MAX_GREP_RESULTS = 100
MAX_GREP_LINE_CHARS = 500
MAX_GLOB_RESULTS = 1000
MAX_GLOB_VISITS = 200_000
"""Entries one Glob looks at, at most (a huge tree answers what it found, ``truncated``)."""
SNIFF_BYTES = 8192
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules"})


class Refused(Exception):
    """An operation refused with a message for the model."""


def failure(message: str) -> dict:
    return {"success": False, "error": message}


class Root:
    """The folder the tools are confined to; ``absolute`` says whether answers show absolute paths (host mode) or
    paths relative to the root (workspace mode, whose absolute paths mean nothing outside the sandbox)."""

    def __init__(self, path: str, absolute: bool = True) -> None:
        self.path = os.path.realpath(path)
        self.absolute = absolute
        self.label = f"the working directory {self.path!r}" if absolute else "the workspace"

    def resolve(self, path: str, what: str = "path") -> str:
        """``path``'s fully resolved location, refused when it is outside the root."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise Refused(f"{what} must be a non-empty string")
        candidate = os.path.join(self.path, os.path.expanduser(path) if path.startswith("~") else path)
        real = os.path.realpath(candidate)
        if not self.inside(real):
            raise Refused(f"{what} {path!r} is outside {self.label}; only paths inside it may be used")
        return real

    def inside(self, real: str) -> bool:
        return real == self.path or real.startswith(self.path.rstrip(os.sep) + os.sep)

    def shown(self, real: str) -> str:
        if self.absolute:
            return real
        rel = os.path.relpath(real, self.path)
        return "." if rel == "." else rel


def decode(data: bytes, name: str) -> str:
    """A file's text: UTF-8 (a BOM dropped), else GB18030; refused when binary or neither."""
    if b"\0" in data[:SNIFF_BYTES]:
        raise Refused(f"{name} is a binary file; Read returns text only")
    for encoding in ("utf-8-sig", "gb18030"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    raise Refused(f"{name} is not text in a known encoding (UTF-8 or GB18030); Read returns text only")


def _regular(real: str, path: str) -> None:
    if not os.path.exists(real):
        raise Refused(f"file not found: {path}")
    if not os.path.isfile(real):
        raise Refused(f"{path} is not a regular file")


def read(root: Root, path: str, start_line: int | None = None, end_line: int | None = None) -> dict:
    real = root.resolve(path)
    _regular(real, path)
    size = os.path.getsize(real)
    if size > MAX_READ_BYTES:
        raise Refused(over_read_cap(path, size))
    with open(real, "rb") as handle:
        return read_answer(handle.read(MAX_READ_BYTES + 1), path, start_line, end_line)


def over_read_cap(path: str, size: int) -> str:
    return (f"{path} is {size} bytes; Read takes files up to {MAX_READ_BYTES} bytes (use Grep to search it, or Bash "
            f"to cut out a part)")


def read_answer(data: bytes, path: str, start_line: int | None = None, end_line: int | None = None) -> dict:
    """Read's answer for a file's bytes: refused when binary or out of range."""
    return text_answer(decode(data, path), path, start_line, end_line)


def text_answer(text: str, path: str, start_line: int | None = None, end_line: int | None = None) -> dict:
    """Read's answer for a file's text (``decode``): refused when out of range."""
    lines = text.splitlines(keepends=True)
    total = len(lines)
    first = 1 if start_line is None else start_line
    last = total if end_line is None else min(end_line, total)
    if first < 1 or (end_line is not None and end_line < first):
        raise Refused(f"invalid line range {start_line}-{end_line}: lines are numbered from 1 and end_line must not "
                      f"come before start_line")
    if total and first > total:
        raise Refused(f"start_line {first} is past the end of {path} ({total} lines)")
    truncated = last - first + 1 > MAX_READ_LINES
    if truncated:
        last = first + MAX_READ_LINES - 1
    answer = {
        "success": True,
        "content": "".join(lines[first - 1:last]),
        "total_lines": total,
        "read_range": f"{first}-{last}" if total else "0-0",
    }
    if truncated:
        answer["truncated"] = True
        answer["message"] = f"only {MAX_READ_LINES} lines are returned at once; read on from line {last + 1}"
    return answer


def write(root: Root, path: str, content: str, append: bool = False) -> dict:
    real = root.resolve(path)
    data = content.encode("utf-8")
    if len(data) > MAX_WRITE_BYTES:
        raise Refused(f"content is {len(data)} bytes; Write takes up to {MAX_WRITE_BYTES} bytes")
    if os.path.isdir(real):
        raise Refused(f"{path} is a directory")
    os.makedirs(os.path.dirname(real), exist_ok=True)
    # The final component was resolved above: O_NOFOLLOW refuses a link planted there since.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(real, flags, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    name = os.path.relpath(real, root.path)
    verb = "appended to" if append else "written to"
    return {"success": True, "message": f"SUCCESS: file {name} {verb} successfully ({len(data)} bytes)",
            "path": root.shown(real)}


def _tolerant_pattern(old: str) -> re.Pattern:
    """``old`` with each run of spaces and tabs matching any such run (the guide's whitespace tolerance)."""
    parts = re.split(r"[ \t]+", old)
    return re.compile(r"[ \t]+".join(re.escape(p) for p in parts))


def _closest(text: str, old: str) -> str:
    """The file's passage most like ``old``, as a hint."""
    import difflib  # only on a failed Edit: the sandbox's interpreter starts without it

    lines, wanted = text.splitlines(), old.splitlines() or [old]
    width = len(wanted)
    best, best_at = 0.0, 0
    for at in range(max(1, len(lines) - width + 1)):
        ratio = difflib.SequenceMatcher(None, "\n".join(lines[at:at + width]), old).ratio()
        if ratio > best:
            best, best_at = ratio, at
    if best < 0.5:
        return ""
    return f" The most similar text (lines {best_at + 1}-{best_at + width}):\n" + "\n".join(lines[best_at:best_at + width])


def edit(root: Root, path: str, old_string: str, new_string: str) -> dict:
    real = root.resolve(path)
    _regular(real, path)
    if not old_string:
        raise Refused("old_string must not be empty")
    if os.path.getsize(real) > MAX_READ_BYTES:
        raise Refused(f"{path} is larger than {MAX_READ_BYTES} bytes; Edit takes smaller files")
    with open(real, "rb") as handle:
        raw = handle.read()
    text = decode(raw, path)
    spans = [(m.start(), m.end()) for m in re.finditer(re.escape(old_string), text)]
    if not spans:
        spans = [(m.start(), m.end()) for m in _tolerant_pattern(old_string).finditer(text)]
    if not spans:
        raise Refused(f"old_string was not found in {path} (it must match the file's text exactly, apart from spaces "
                      f"and tabs); the file is unchanged.{_closest(text, old_string)}")
    if len(spans) > 1:
        where = ", ".join(str(text.count("\n", 0, start) + 1) for start, _ in spans[:10])
        raise Refused(f"old_string matches {len(spans)} places in {path} (lines {where}); include more surrounding "
                      f"text so it matches exactly one. The file is unchanged.")
    start, end = spans[0]
    updated = text[:start] + new_string + text[end:]
    encoding = "utf-8-sig" if raw.startswith(b"\xef\xbb\xbf") else "utf-8"
    with open(real, "w", encoding=encoding, newline="") as handle:
        handle.write(updated)
    first = text.count("\n", 0, start) + 1
    last = first + max(new_string.count("\n") - (1 if new_string.endswith("\n") else 0), 0)
    name = os.path.relpath(real, root.path)
    return {"success": True, "message": f"SUCCESS: file {name} modified successfully",
            "line_range": f"{first}-{last}", "changed_line_ranges": [(first, last)]}


def _text_file(real: str) -> bool:
    try:
        if os.path.getsize(real) > MAX_READ_BYTES:
            return False
        with open(real, "rb") as handle:
            return b"\0" not in handle.read(SNIFF_BYTES)
    except OSError:
        return False


def _walk(root: Root, top: str):
    """The regular files under ``top`` whose resolved path stays in the root (links out are passed over)."""
    if os.path.isfile(top):
        yield top
        return
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            full = os.path.join(folder, name)
            if root.inside(os.path.realpath(full)) and os.path.isfile(full):
                yield full


def grep(root: Root, pattern: str, path: str = ".", case_sensitive: bool = True,
         max_results: int = MAX_GREP_RESULTS) -> dict:
    if max_results < 1:
        raise Refused("max_results must be 1 or more")
    try:
        regex = re.compile(pattern, 0 if case_sensitive else re.IGNORECASE)
    except re.error as exc:
        raise Refused(f"invalid regular expression {pattern!r}: {exc}") from None
    top = root.resolve(path)
    if not os.path.exists(top):
        raise Refused(f"path not found: {path}")
    matches, total = [], 0
    for full in _walk(root, top):
        if not _text_file(full):
            continue
        with open(full, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                if regex.search(line):
                    total += 1
                    if len(matches) < max_results:
                        shown = line.rstrip("\r\n")
                        matches.append({"file": os.path.relpath(full, root.path), "line": number,
                                        "content": shown[:MAX_GREP_LINE_CHARS]})
    answer = {"success": True, "matches": matches, "total_matches": total}
    if total > len(matches):
        answer["truncated"] = True
    return answer


def glob(root: Root, pattern: str, path: str = ".", max_results: int = MAX_GLOB_RESULTS) -> dict:
    """Files and folders under ``path`` matching ``pattern``, walked without following links to folders (a link
    loop cannot make it run away) and at most ``MAX_GLOB_VISITS`` entries looked at (``truncated`` past that)."""
    if not pattern:
        raise Refused("pattern must not be empty")
    if max_results < 1:
        raise Refused("max_results must be 1 or more")
    base = root.resolve(path)
    patterns = []
    try:
        alternatives = expand_braces(pattern)
    except ValueError as exc:
        raise Refused(f"pattern {exc}") from None
    for one in alternatives:
        parts = tuple(p for p in one.replace("\\", "/").split("/") if p not in ("", "."))
        if os.path.isabs(one) or ".." in parts:
            raise Refused(f"pattern {pattern!r} must be relative and may not contain '..'")
        patterns.append(parts)
    deepest = None if any("**" in p for p in patterns) else max(len(p) for p in patterns)
    found, visited, cut = [], 0, False
    for folder, dirs, files in os.walk(base):
        rel = () if folder == base else tuple(os.path.relpath(folder, base).split(os.sep))
        if deepest is not None and len(rel) >= deepest:
            dirs[:] = []
        dirs.sort()
        for name in sorted(dirs + files):
            visited += 1
            if visited > MAX_GLOB_VISITS:
                cut = True
                break
            parts = rel + (name,)
            if any(segments_match(parts, p) for p in patterns):
                full = os.path.join(folder, name)
                if root.inside(os.path.realpath(full)):
                    found.append(full)
        if cut:
            break
    found.sort()
    return {"success": True, "matches": [root.shown(p) for p in found[:max_results]],
            "count": min(len(found), max_results), "truncated": cut or len(found) > max_results, "pattern": pattern}


OPERATIONS = {"read": read, "write": write, "edit": edit, "grep": grep, "glob": glob}


def call(root: Root, operation: str, args: dict) -> dict:
    """One operation's answer; a refusal or an OS error becomes the guide's failure shape."""
    try:
        return OPERATIONS[operation](root, **args)
    except Refused as exc:
        return failure(str(exc))
    except OSError as exc:
        return failure(f"{operation} failed: {exc.strerror or exc}")


def main(argv: list[str]) -> None:
    """In a sandbox: ``<root> <operation> <json args or @file>``; the answer as one JSON line on stdout."""
    root, operation, raw = argv[1:4]
    if raw.startswith("@"):
        with open(raw[1:], encoding="utf-8") as handle:
            raw_args = handle.read()
        os.unlink(raw[1:])
    else:
        raw_args = raw
    answer = call(Root(root, absolute=False), operation, json.loads(raw_args))
    sys.stdout.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main(sys.argv)
