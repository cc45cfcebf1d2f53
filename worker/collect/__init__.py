"""Output collection: glob patterns in, capped file contents with MIME types out.

Patterns are relative to the staged skill folder (``out/*.txt``) or start with a workspace variable
(``$OUTPUT_DIR/**/*.csv``); ``**`` matches any number of folders and ``{a,b}`` alternatives. A pattern that
could leave the workspace (absolute outside it, or with a ``..`` segment) is refused before the command runs.
A match is collected only if its real path lies inside the workspace and it is a regular file; symlinks out
of the workspace, FIFOs, devices and sockets are listed in ``skipped_files`` with the reason. No file is ever
read past the per-file or the total byte cap.
"""

from __future__ import annotations

import base64
import fnmatch
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from worker.contract import ArtifactFile, OutputFile, RunLimits, SkippedFile
from worker.errors import ArtifactError, InvalidRunRequestError
from worker.mime import detect_mime, is_text

MAX_BRACE_EXPANSIONS = 256
READ_CHUNK_BYTES = 64 * 1024
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_MAGIC = re.compile(r"[*?\[]")

ArtifactSink = Callable[[str, int, str], ArtifactFile]
"""Called with (name, open file descriptor, MIME type) for each collected file when artifacts are saved."""


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


@dataclass
class Collection:
    files: list[OutputFile] = field(default_factory=list)
    artifacts: list[ArtifactFile] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)


def collect_outputs(
    patterns: list[str],
    *,
    workspace_root: Path,
    skill_dir: Path,
    limits: RunLimits,
    omit_inline_content: bool = False,
    artifact_sink: ArtifactSink | None = None,
    true_sizes: Mapping[str, int] | None = None,
) -> Collection:
    """Collect the files that resolved ``patterns`` match, within the caps of ``limits``.

    ``true_sizes`` (real path → bytes) gives the size of files that hold only their head here (a mirror of a
    remote workspace); a file's reported size and ``truncated`` flag follow it."""
    root = os.path.realpath(workspace_root)
    result = Collection()
    seen: set[str] = set()
    remaining = limits.output_total_bytes
    for pattern in patterns:
        base = "/" if pattern.startswith("/") else str(skill_dir)
        segments = [s for s in pattern.split("/") if s not in ("", ".")]
        for path in _match(base, segments, root):
            real = os.path.realpath(path)
            name = os.path.relpath(real, root) if _inside(real, root) else os.path.relpath(path, skill_dir)
            if name in seen:
                continue
            seen.add(name)
            if not _inside(real, root):
                result.skipped.append(SkippedFile(name=name, reason="resolves outside the workspace"))
                continue
            if len(result.files) >= limits.output_max_files:
                result.skipped.append(SkippedFile(name=name, reason=f"more than {limits.output_max_files} output files"))
                continue
            collected = _read_one(root, real, name, min(limits.output_file_bytes, remaining), omit_inline_content,
                                  artifact_sink, (true_sizes or {}).get(real))
            if isinstance(collected, SkippedFile):
                result.skipped.append(collected)
                continue
            output, artifact, used = collected
            remaining -= used
            if output is not None:
                result.files.append(output)
            if artifact is not None:
                result.artifacts.append(artifact)
    return result


def _inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root + os.sep)


def _toward_or_inside(real: str, root: str) -> bool:
    """Inside the workspace, or one of the folders above it that an absolute pattern passes through."""
    return _inside(real, root) or root.startswith(real.rstrip(os.sep) + os.sep)


def _match(base: str, segments: list[str], root: str) -> list[str]:
    found: list[str] = []
    visited: set[str] = set()

    def walk(directory: str, segs: list[str]) -> None:
        if not segs:
            found.append(directory)
            return
        seg, rest = segs[0], segs[1:]
        if seg == "**":
            walk(directory, rest)
            for entry in _entries(directory):
                if entry.is_dir() and not entry.name.startswith("."):
                    real = os.path.realpath(entry.path)
                    if _inside(real, root) and real not in visited:
                        visited.add(real)
                        walk(entry.path, segs)
            return
        if _MAGIC.search(seg):
            for entry in _entries(directory):
                if entry.name.startswith(".") and not seg.startswith("."):
                    continue
                if fnmatch.fnmatchcase(entry.name, seg):
                    if rest:
                        if entry.is_dir() and _inside(os.path.realpath(entry.path), root):
                            walk(entry.path, rest)
                    else:
                        found.append(entry.path)
            return
        path = os.path.join(directory, seg)
        if rest:
            # Never descend (and so never list) outside the workspace, whatever link a command planted.
            if os.path.isdir(path) and _toward_or_inside(os.path.realpath(path), root):
                walk(path, rest)
        elif os.path.lexists(path):
            found.append(path)

    walk(base, segments)
    return found


def _entries(directory: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def _open_beneath(root: str, real: str) -> int:
    """Open ``real`` (inside ``root``) one component at a time, refusing any symlink on the way, so a command that
    swaps a folder for a link while collection runs cannot make it read outside the workspace."""
    parts = os.path.relpath(real, root).split(os.sep)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def _read_one(
    root: str, real: str, name: str, budget: int, omit_inline: bool, sink: ArtifactSink | None, true_size: int | None
) -> tuple[OutputFile | None, ArtifactFile | None, int] | SkippedFile:
    try:
        info = os.lstat(real)
    except OSError as exc:
        return SkippedFile(name=name, reason=f"cannot be read: {exc.strerror or exc}")
    if stat.S_ISDIR(info.st_mode):
        return SkippedFile(name=name, reason="is a directory")
    if not stat.S_ISREG(info.st_mode):
        return SkippedFile(name=name, reason=f"is not a regular file ({_kind(info.st_mode)})")
    try:
        fd = _open_beneath(root, real)
    except OSError as exc:
        return SkippedFile(name=name, reason=f"cannot be opened (it changed while being collected?): {exc.strerror}")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # swapped after the lstat
            return SkippedFile(name=name, reason=f"is not a regular file ({_kind(info.st_mode)})")
        data = _read_at_most(fd, max(budget, 0))
        head = data[:8192] if data else os.pread(fd, 8192, 0)
        mime = detect_mime(name, head)
        try:
            artifact = sink(name, fd, mime) if sink is not None else None
        except (ArtifactError, OSError) as exc:
            return SkippedFile(name=name, reason=f"could not be stored as an artifact: {exc}")
    finally:
        os.close(fd)
    size = info.st_size if true_size is None else true_size
    truncated = size > len(data)
    if omit_inline:
        output = OutputFile(name=name, content="", mime_type=mime, size=size, truncated=truncated, encoding="none")
    elif is_text(mime, head):
        output = OutputFile(name=name, content=data.decode("utf-8", "replace"), mime_type=mime, size=size, truncated=truncated)
    else:
        output = OutputFile(
            name=name, content=base64.b64encode(data).decode("ascii"), mime_type=mime, size=size,
            truncated=truncated, encoding="base64",
        )
    return output, artifact, len(data)


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(READ_CHUNK_BYTES, left))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a plain file"
