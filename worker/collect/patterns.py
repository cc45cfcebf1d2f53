"""Output patterns: workspace variables and ``{a,b}`` alternatives (``worker.collect.globs``) expanded, and patterns
that could leave the workspace (absolute outside it, or with a ``..`` segment) refused before the command runs."""

from __future__ import annotations

import os
import re
from pathlib import Path

from worker.collect.globs import expand_braces
from worker.errors import InvalidRunRequestError

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


def resolve_patterns(patterns: list[str], variables: dict[str, str], workspace_root: Path) -> list[str]:
    """Validate and expand output patterns before the run; each result is absolute or skill-relative."""
    resolved: list[str] = []
    root = os.path.normpath(workspace_root)
    for raw in patterns:
        if not raw or "\0" in raw:
            raise InvalidRunRequestError("output_files", f"{raw!r} is not a usable glob pattern")
        expanded = expand_variables(raw, variables)
        try:
            alternatives = expand_braces(expanded)
        except ValueError as exc:
            raise InvalidRunRequestError("output_files", str(exc)) from None
        for pattern in alternatives:
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
