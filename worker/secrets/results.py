"""Redaction applied to what a run gives back: every text field of its result (``redact_result``), and its
artifacts as they stream into the store (``redacting_sink``)."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator

from pydantic import BaseModel

from worker import defaults
from worker.artifacts.base import COPY_CHUNK_BYTES, BaseArtifactStore
from worker.collect import ArtifactSink
from worker.contract import ArtifactFile, OutputFile, RunLimits, RunResult
from worker.secrets.redactor import Redactor

IDENTITY_FIELDS = frozenset({"run_id", "workspace_id", "runtime", "worker_id", "sha256", "encoding", "mime_type"})
"""Result fields no run makes the text of (ids, the runtime's name, digests, the MIME type's name): every other
text field of a ``RunResult``, at any depth, is redacted."""
_CUT = defaults.TRUNCATION_MARKER.split("{")[0]


def redact_result(result: RunResult, redactor: Redactor, limits: RunLimits | None = None) -> None:
    """Take the secrets out of a result in place: every text field at any depth but ``IDENTITY_FIELDS`` — stdout
    and stderr (a cut one's end too), the output files' names and inline content (text, and binary content
    decoded, redacted and encoded again), artifacts' names, refused files, egress refusals, and whatever field
    is added later. With the run's ``limits``, redaction never makes stdout, stderr or a file's inline content
    longer than its cap, or than the run gave it when that was more (a placeholder may be longer than the value
    it replaces: what passes is cut, and marked cut)."""
    if not redactor:
        return
    started = time.monotonic()
    caps = (limits.stdout_bytes, limits.stderr_bytes, limits.output_file_bytes) if limits else (None, None, None)
    result.stdout, result.stdout_truncated = _cut_text(redactor, result.stdout, result.stdout_truncated, caps[0])
    result.stderr, result.stderr_truncated = _cut_text(redactor, result.stderr, result.stderr_truncated, caps[1])
    for output in result.output_files:
        _redact_file(redactor, output, caps[2])
    _redact_model(redactor, result, skip={"stdout", "stderr"})
    took = round((time.monotonic() - started) * 1000, 3)
    result.timings.redact_ms = took
    result.timings.total_ms = round(result.timings.total_ms + took, 3)


def _redact_model(redactor: Redactor, model: BaseModel, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """Every text field of ``model`` and of the models it holds (in lists too), redacted in place."""
    if isinstance(model, OutputFile):
        skip = {"content"}  # redacted by _redact_file, which knows its cap
    for name in type(model).model_fields:
        if name in skip or name in IDENTITY_FIELDS:
            continue
        value = getattr(model, name)
        if isinstance(value, str):
            setattr(model, name, redactor.text(value))
        elif isinstance(value, BaseModel):
            _redact_model(redactor, value)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, BaseModel):
                    _redact_model(redactor, item)
                elif isinstance(item, str):
                    value[index] = redactor.text(item)
        elif isinstance(value, dict):
            setattr(model, name, {redactor.text(key) if isinstance(key, str) else key:
                                  redactor.text(item) if isinstance(item, str) else item for key, item in value.items()})


def _cut_text(redactor: Redactor, text: str, truncated: bool, cap: int | None) -> tuple[str, bool]:
    """``text`` (stdout or stderr) redacted, and whether it is cut now (``cap``: see ``redact_result``)."""
    head, marker, tail = text.rpartition(_CUT) if truncated else ("", "", text)
    if not marker:
        redacted, cut = _within(redactor.text(text), _room(text, cap))
        return (redacted + defaults.TRUNCATION_MARKER.format(omitted=cut), True) if cut else (redacted, truncated)
    redacted, _ = _within(redactor.text(head, cut=True), _room(head, cap))
    return redacted + marker + tail, True


def _room(text: str, cap: int | None) -> int | None:
    """What redacting ``text`` may grow to: its cap, or its own size when that is more (``None``: no bound)."""
    return None if cap is None else max(cap, len(text.encode("utf-8", "surrogatepass")))


def _within(text: str, size: int | None) -> tuple[str, int]:
    """``text`` cut to ``size`` bytes of UTF-8 (at a character's end), and how many bytes were cut."""
    if size is None or len(text) * 4 <= size:
        return text, 0
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= size:
        return text, 0
    return data[:size].decode("utf-8", "ignore"), len(data) - size


def _redact_file(redactor: Redactor, output: OutputFile, cap: int | None) -> None:
    if output.encoding == "utf-8":
        redacted, cut = _within(redactor.text(output.content, cut=output.truncated), _room(output.content, cap))
        output.content, output.truncated = redacted, output.truncated or bool(cut)
    elif output.encoding == "base64" and output.content:
        data = base64.b64decode(output.content)
        redacted = redactor.data(data, cut=output.truncated)
        if redacted != data:
            room = len(redacted) if cap is None else max(cap, len(data))
            output.content = base64.b64encode(redacted[:room]).decode()
            output.truncated = output.truncated or len(redacted) > room


def redacting_sink(store: BaseArtifactStore, scope: str, redactor: Redactor) -> ArtifactSink:
    """The artifact store's sink for ``scope``, storing every file with the secrets taken out of its name and its
    content (text or binary), streamed: a chunk at a time, never the whole file in memory."""
    sink = store.sink(scope)
    if not redactor:
        return sink

    def save(name: str, fd: int, mime_type: str, max_bytes: int) -> ArtifactFile:
        return store.save_chunks(scope, redactor.text(name), redactor.redacted_chunks(_chunks(fd)), mime_type,
                                 max_bytes)

    return save


def _chunks(fd: int) -> Iterator[bytes]:
    offset = 0
    while chunk := os.pread(fd, COPY_CHUNK_BYTES, offset):
        offset += len(chunk)
        yield chunk


__all__ = ["IDENTITY_FIELDS", "redact_result", "redacting_sink"]
