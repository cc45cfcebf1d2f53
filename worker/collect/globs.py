"""Glob patterns, read one way wherever Skillrun reads them (output collection, the Cube runtime's listing in its
sandbox, the file tools' ``Glob``): ``{a,b}`` alternatives, nested too; ``*``, ``?`` and ``[...]`` within one name,
where a leading dot is matched only by a leading dot; ``**`` any number of folders, hidden ones not.

Standard library only, importing nothing of either plane: the file tools' operations carry this module's text into
a sandbox (``orchestrator.tools.file_tools.workspace``), and it must run there as it runs here.
"""

from __future__ import annotations

import fnmatch

MAX_BRACE_EXPANSIONS = 256


def expand_braces(pattern: str, limit: int = MAX_BRACE_EXPANSIONS) -> list[str]:
    """``a/{b,c}/*.{png,csv}`` → the four patterns it stands for, in order, each once; an unmatched or comma-less
    brace is literal text. ``ValueError`` past ``limit`` patterns."""
    results = [pattern]
    done: dict[str, None] = {}
    while results:
        current = results.pop()
        start = current.find("{")
        if start < 0:
            done[current] = None
            continue
        depth, end, commas = 0, -1, []
        for i in range(start, len(current)):
            ch = current[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    end = i
                    break
            elif ch == "," and depth == 1:
                commas.append(i)
        if end < 0 or not commas:
            head, tail = current[: start + 1], current[start + 1 :]
            done.update((head + rest, None) for rest in expand_braces(tail, limit))
            continue
        bounds = [start, *commas, end]
        alternatives = [current[:start] + current[a + 1 : b] + current[end + 1 :] for a, b in zip(bounds, bounds[1:])]
        results.extend(reversed(alternatives))
        if len(results) + len(done) > limit:
            raise ValueError(f"{pattern!r} expands to more than {limit} patterns")
    return list(done)


def name_matches(name: str, segment: str) -> bool:
    """Whether one name matches one segment of a pattern (``*``, ``?``, ``[...]``; a leading dot only by a dot)."""
    return (segment.startswith(".") or not name.startswith(".")) and fnmatch.fnmatchcase(name, segment)


def segments_match(parts: tuple[str, ...], segments: tuple[str, ...]) -> bool:
    """Whether a path's ``parts`` match a pattern's ``segments``: ``**`` is any number of folders (no hidden one),
    each other segment matches one name. Each (part, segment) pair is decided once, without recursion, so a pattern
    of many ``**`` costs parts × segments steps, never the backtracking's exponential number."""
    n, m = len(parts), len(segments)
    rest = [[False] * (m + 1) for _ in range(n + 1)]  # rest[i][j]: parts[i:] match segments[j:]
    rest[n][m] = True
    for j in range(m - 1, -1, -1):
        for i in range(n, -1, -1):
            if segments[j] == "**":  # no folder more, or one more that is not hidden
                rest[i][j] = rest[i][j + 1] or (i < n and not parts[i].startswith(".") and rest[i + 1][j])
            else:
                rest[i][j] = i < n and rest[i + 1][j + 1] and name_matches(parts[i], segments[j])
    return rest[0][0]


def glob_regex(segments: list[str]) -> str:
    """A POSIX extended regular expression for a path below a folder that matches the pattern ``segments`` as
    ``segments_match`` does (for ``find -regextype posix-extended`` in a sandbox)."""
    parts: list[str] = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            parts.append("([^/.][^/]*/)*" + ("[^/.][^/]*" if last else ""))
            continue
        parts.append(_segment_regex(segment) + ("" if last else "/"))
    return "^" + "".join(parts) + "$"


def _segment_regex(segment: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(segment):
        c = segment[i]
        close = segment.find("]", i + 2) if c == "[" else -1
        if c == "*":
            out.append("([^/.][^/]*)?" if i == 0 else "[^/]*")
        elif c == "?":
            out.append("[^/.]" if i == 0 else "[^/]")
        elif close > 0:
            body = segment[i + 1 : close].replace("/", "")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = close
        else:
            out.append("\\" + c if c in _ERE_SPECIAL else c)
        i += 1
    return "".join(out)


_ERE_SPECIAL = frozenset(".^$*+?()[]{}|\\")
