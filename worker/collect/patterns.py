"""Output patterns: workspace variables and ``{a,b}`` alternatives expanded, and patterns that could leave the
workspace (absolute outside it, or with a ``..`` segment) refused before the command runs."""

from __future__ import annotations

import os
import re
from pathlib import Path

from worker.errors import InvalidRunRequestError

MAX_BRACE_EXPANSIONS = 256
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def expand_variables(pattern: str, variables: dict[str, str], field_name: str = "output_files") -> str:
    """Replace ``$NAME`` / ``${NAME}`` of the workspace variables; any other variable is an error."""

    def _sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise InvalidRunRequestError(
                field_name, f"{pattern!r} uses ${name}; only {', '.join('$' + v for v in variables)} may be used"
            )
        return variables[name]

    return _VARIABLE.sub(_sub, pattern)


def expand_braces(pattern: str) -> list[str]:
    """``a/{b,c}/*.{png,csv}`` → the four patterns it stands for (nested braces allowed)."""
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
            # An unmatched or comma-less brace is literal text.
            head, tail = current[: start + 1], current[start + 1 :]
            done.update((head + rest, None) for rest in expand_braces(tail))
            continue
        bounds = [start, *commas, end]
        alternatives = [current[:start] + current[a + 1 : b] + current[end + 1 :] for a, b in zip(bounds, bounds[1:])]
        results.extend(reversed(alternatives))
        if len(results) + len(done) > MAX_BRACE_EXPANSIONS:
            raise InvalidRunRequestError("output_files", f"{pattern!r} expands to more than {MAX_BRACE_EXPANSIONS} patterns")
    return list(done)


def resolve_patterns(patterns: list[str], variables: dict[str, str], workspace_root: Path) -> list[str]:
    """Validate and expand output patterns before the run; each result is absolute or skill-relative."""
    resolved: list[str] = []
    root = os.path.normpath(workspace_root)
    for raw in patterns:
        if not raw or "\0" in raw:
            raise InvalidRunRequestError("output_files", f"{raw!r} is not a usable glob pattern")
        expanded = expand_variables(raw, variables)
        for pattern in expand_braces(expanded):
            parts = pattern.split("/")
            if ".." in parts:
                raise InvalidRunRequestError("output_files", f"{raw!r} may not contain '..': outputs are collected from the workspace only")
            if pattern.startswith("/"):
                normalized = os.path.normpath(pattern)
                if normalized != root and not normalized.startswith(root + os.sep):
                    raise InvalidRunRequestError(
                        "output_files", f"{raw!r} points outside the workspace; use a path relative to the skill folder or $OUTPUT_DIR"
                    )
            resolved.append(pattern)
    return resolved
