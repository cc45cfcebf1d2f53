"""Output collection: glob patterns in, capped file contents with MIME types out.

Patterns are relative to the staged skill folder (``out/*.txt``) or start with a workspace variable
(``$OUTPUT_DIR/**/*.csv``); ``**`` matches any number of folders and ``{a,b}`` alternatives. A pattern that
could leave the workspace (absolute outside it, or with a ``..`` segment) is refused before the command runs
(``patterns``); how a pattern reads is one module, ``globs``, shared with the Cube runtime's listing and the file
tools' ``Glob``. Matching never lists, stats or opens anything outside the workspace (``beneath``): a link out of
it — to a file or a folder — is one ``skipped_files`` entry, and so is whatever else cannot be collected (a FIFO,
a device, a socket, a dangling link, a loop, nesting past ``MAX_DEPTH`` folders, listings past
``MAX_LISTED_ENTRIES`` entries), each with its reason; collection itself does not fail. No file is ever read past
the per-file or the total byte cap, and what comes back is never more than was read: a file of a text type whose
bytes are not UTF-8 comes back as base64 (``_utf8``). Saved as artifacts, files are stored whole, and together count against the
run's ``artifact_total_bytes``: each at its full size (a sparse file's holes too: what is stored is its content),
checked before it is read and again as it is stored (redaction may lengthen it); a file past what is left is
refused. The same collection serves every runtime (a remote one collects from a local mirror of its workspace).

A name in the result is text every store and JSON answer can keep (``_text_name``): a file name is bytes, and each
byte of it that is not UTF-8 is written as Python writes it, ``\\xff`` (``out/\\xff.txt``), so the file is
collected and can be fetched by that name; a second file whose name reads the same (one named with a real
backslash) is skipped, saying so.
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from worker.collect.beneath import MAX_DEPTH, MAX_LISTED_ENTRIES, Beneath, PathRefusedError
from worker.collect.globs import expand_braces, glob_regex, name_matches, segments_match
from worker.collect.patterns import expand_variables, resolve_patterns
from worker.contract import ArtifactFile, OutputFile, RunLimits, SkippedFile
from worker.errors import ArtifactError
from worker.collect.mime import detect_mime, is_text

__all__ = [
    "MAX_DEPTH", "MAX_LISTED_ENTRIES", "ArtifactSink", "Collection", "collect_outputs", "expand_braces",
    "expand_variables", "glob_regex", "name_matches", "resolve_patterns", "segments_match",
]

READ_CHUNK_BYTES = 64 * 1024
_SAME_NAME = "its name, written as text, is another output's: bytes that are not UTF-8 are written \\xNN"

ArtifactSink = Callable[[str, int, str, int], ArtifactFile]
"""Called with (name, open file descriptor, MIME type, the most bytes it may store) for each collected file when
artifacts are saved."""


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
    tree = Beneath(root, (root, os.path.abspath(workspace_root)))
    skill_rel = os.path.relpath(os.path.abspath(skill_dir), os.path.abspath(workspace_root))
    result = Collection()
    seen: set[str] = set()
    named: dict[str, str] = {}
    """Each name in the result, and the file's own name it stands for."""
    remaining = limits.output_total_bytes
    room = limits.artifact_total_bytes
    try:
        for pattern in patterns:
            for found in tree.match(pattern, skill_rel):
                own = found.name if isinstance(found, PathRefusedError) else "/".join(found[0])
                if own in seen:
                    continue
                seen.add(own)
                name = _text_name(own)
                if named.setdefault(name, own) != own:
                    result.skipped.append(SkippedFile(name=name, reason=_SAME_NAME))
                    continue
                if isinstance(found, PathRefusedError):
                    result.skipped.append(SkippedFile(name=name, reason=found.reason))
                    continue
                if len(result.files) >= limits.output_max_files:
                    result.skipped.append(SkippedFile(name=name, reason=f"more than {limits.output_max_files} output files"))
                    continue
                rel, info = found
                collected = _read_one(tree, rel, info, name, min(limits.output_file_bytes, remaining),
                                      omit_inline_content, artifact_sink, (true_sizes or {}).get(os.path.join(root, *rel)),
                                      room)
                if isinstance(collected, SkippedFile):
                    result.skipped.append(collected)
                    continue
                output, artifact, used = collected
                remaining -= used
                if output is not None:
                    result.files.append(output)
                if artifact is not None:
                    result.artifacts.append(artifact)
                    room -= artifact.size
    except PathRefusedError as stop:  # the listing budget is spent: what was collected so far stands
        result.skipped.append(SkippedFile(name=_text_name(stop.name), reason=stop.reason))
    return result


def _text_name(name: str) -> str:
    """``name``, a path read from the file system, as text every store can keep: each byte that is not UTF-8 (which
    Python reads as a lone surrogate) written ``\\xNN``, as Python's ``backslashreplace`` writes it."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _read_one(
    tree: Beneath, rel: tuple[str, ...], info: os.stat_result, name: str, budget: int, omit_inline: bool,
    sink: ArtifactSink | None, true_size: int | None, room: int,
) -> tuple[OutputFile | None, ArtifactFile | None, int] | SkippedFile:
    if stat.S_ISDIR(info.st_mode):
        return SkippedFile(name=name, reason="is a directory")
    if not stat.S_ISREG(info.st_mode):
        return SkippedFile(name=name, reason=f"is not a regular file ({_kind(info.st_mode)})")
    try:
        # Opened beneath the root without following any link: a folder swapped for a link meanwhile gets nothing.
        fd = tree.open(rel, os.O_NONBLOCK)
    except OSError as exc:
        return SkippedFile(name=name, reason=f"cannot be opened (it changed while being collected?): {exc.strerror}")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # swapped after it was looked at
            return SkippedFile(name=name, reason=f"is not a regular file ({_kind(info.st_mode)})")
        size = info.st_size if true_size is None else true_size
        if sink is not None and size > room:
            return SkippedFile(name=name, reason=f"is {size} bytes, more than the {max(room, 0)} the run's artifacts "
                                                 "may still hold (limits.artifact_total_bytes)")
        data = _read_at_most(fd, max(budget, 0))
        head = data[:8192] if data else os.pread(fd, 8192, 0)
        mime = detect_mime(name, head)
        try:
            artifact = sink(name, fd, mime, room) if sink is not None else None
        except (ArtifactError, OSError) as exc:
            return SkippedFile(name=name, reason=f"could not be stored as an artifact: {exc}")
    except OSError as exc:
        return SkippedFile(name=name, reason=f"cannot be read: {exc.strerror or exc}")
    finally:
        os.close(fd)
    truncated = size > len(data)
    if omit_inline:
        output = OutputFile(name=name, content="", mime_type=mime, size=size, truncated=truncated, encoding="none")
    elif is_text(mime, head) and (text := _utf8(data, cut=truncated)) is not None:
        output = OutputFile(name=name, content=text, mime_type=mime, size=size, truncated=truncated)
    else:
        output = OutputFile(
            name=name, content=base64.b64encode(data).decode("ascii"), mime_type=mime, size=size,
            truncated=truncated, encoding="base64",
        )
    return output, artifact, len(data)


def _utf8(data: bytes, *, cut: bool) -> str | None:
    """``data`` as text when it is UTF-8 (of a file ``cut`` short, a character its end splits is dropped); ``None``
    otherwise: it goes back as base64, whole, never as text with replacement characters, which would take more
    bytes than the caps let the file have (three for each byte replaced)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if cut and exc.end == len(data) and exc.start >= len(data) - 3:
            return data[:exc.start].decode("utf-8")
        return None


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
