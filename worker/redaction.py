"""``Redactor``: a team's secret values taken out of what its runs give back.

Each secret's value is replaced by ``[redacted:NAME]`` wherever it appears in a run's stdout, stderr, output files
(text and binary, inline and stored as artifacts), file names and refusal reasons, and error messages — as it is,
and in the forms a command is most likely to print it in:

* base64, standard and URL-safe alphabets: the characters that depend on the value alone, at each of the three
  alignments the value can have in a longer base64 text (so ``echo -n "x$S" | base64`` is caught too), and each
  line of the value's base64 wrapped at 76 characters (``base64`` and MIME wrap long values);
* hexadecimal, lower and upper case;
* percent-encoded, as ``urllib.parse.quote`` writes it with and without ``/`` kept, and ``quote_plus``;
* escaped inside a JSON string or a Python ``repr``.

Longer forms are replaced first, so a form that contains another is replaced whole. Where output was cut at a cap,
the end of what was kept is also cleared of the start of any form (a value cut in two is not left half shown).
A command that transforms its secret otherwise (reverses it, encrypts it, prints it a character per line) is not
caught: redaction keeps honest mistakes out of the model's context, it does not contain a hostile skill (see the
README's security model).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
from urllib.parse import quote, quote_plus

from worker import defaults
from worker.artifacts.base import BaseArtifactStore, MeteredReader
from worker.collect import ArtifactSink
from worker.contract import ArtifactFile, OutputFile, RunResult

PLACEHOLDER = "[redacted:{name}]"
MIN_FORM_CHARACTERS = 6
"""Base64 pieces shorter than this are not looked for (they would match ordinary text)."""
MIN_CUT_CHARACTERS = 4
"""The shortest start of a form cleared from the end of output cut at a cap."""
MIME_LINE = 76
_CUT = defaults.TRUNCATION_MARKER.split("{")[0]


class Redactor:
    """Replaces the values of ``secrets`` (name → value) and their encoded forms."""

    def __init__(self, secrets: dict[str, str]) -> None:
        forms: dict[str, str] = {}
        for name, value in secrets.items():
            for form in _forms(value):
                forms.setdefault(form, PLACEHOLDER.format(name=name))
        self._forms = forms
        self._longest_first = sorted(forms, key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._forms)

    def text(self, text: str, *, cut: bool = False) -> str:
        """``text`` redacted; ``cut``: it ends where a cap cut it, so a form's start at its end goes too."""
        if not self._forms or not text:
            return text
        present = tuple(form for form in self._longest_first if form in text)  # a substring search: fast
        if present:  # a pattern of the forms found (Python's re tries every alternative at each position)
            text = _pattern_of(present).sub(lambda match: self._forms[match.group(0)], text)
        return self._clear_end(text) if cut else text

    def data(self, data: bytes, *, cut: bool = False) -> bytes:
        """``data`` redacted as bytes (what is not UTF-8 is kept as it is, so binary content stays intact except
        where a form of a value appears)."""
        if not self._forms or not data:
            return data
        return self.text(data.decode("utf-8", "surrogateescape"), cut=cut).encode("utf-8", "surrogateescape")

    def _clear_end(self, text: str) -> str:
        for form in self._longest_first:
            for length in range(min(len(form) - 1, len(text)), MIN_CUT_CHARACTERS - 1, -1):
                if text.endswith(form[:length]):
                    return text[:-length] + self._forms[form]
        return text


@functools.lru_cache(maxsize=256)
def _pattern_of(forms: tuple[str, ...]) -> re.Pattern[str]:
    """One pattern matching any of ``forms`` (longest first)."""
    return re.compile("|".join(map(re.escape, forms)))


def _forms(value: str) -> set[str]:
    raw = value.encode()
    forms = {value, raw.hex(), raw.hex().upper(), quote(value, safe=""), quote(value), quote_plus(value, safe=""),
             json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], repr(value)[1:-1]}
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        forms |= {piece for piece in _base64_pieces(raw, encode) if len(piece) >= MIN_FORM_CHARACTERS}
    return {form for form in forms if form}


def _base64_pieces(raw: bytes, encode) -> set[str]:  # noqa: ANN001 - base64's encoders
    """The base64 characters that depend on ``raw`` alone, for each of its three alignments in a longer text (the
    first and last groups of four, which hold neighbouring bytes, are left out); and the value's own base64, whole
    and in lines of ``MIME_LINE``."""
    pieces = set()
    for lead in range(3):
        encoded = encode(b"\0" * lead + raw).decode()
        start = 4 if lead else 0
        end = (lead + len(raw)) // 3 * 4
        pieces.add(encoded[start:end])
    whole = encode(raw).decode()
    pieces |= {whole, whole.rstrip("=")}
    if len(whole) > MIME_LINE:
        pieces |= {whole[i:i + MIME_LINE] for i in range(0, len(whole), MIME_LINE)}
    return pieces


def redact_result(result: RunResult, redactor: Redactor) -> None:
    """Take the secrets out of a result in place: stdout and stderr (a cut one's end too), the output files'
    names and inline content (text, and binary content decoded, redacted and encoded again), the artifacts' names,
    the refused files' names and reasons."""
    if not redactor:
        return
    result.stdout = _cut_text(redactor, result.stdout, result.stdout_truncated)
    result.stderr = _cut_text(redactor, result.stderr, result.stderr_truncated)
    for output in result.output_files:
        _redact_file(redactor, output)
    for artifact in result.artifact_files:
        artifact.name = redactor.text(artifact.name)
    for skipped in result.skipped_files:
        skipped.name = redactor.text(skipped.name)
        skipped.reason = redactor.text(skipped.reason)


def _cut_text(redactor: Redactor, text: str, truncated: bool) -> str:
    head, marker, tail = text.rpartition(_CUT) if truncated else ("", "", text)
    if not marker:
        return redactor.text(text)
    return redactor.text(head, cut=True) + marker + tail


def _redact_file(redactor: Redactor, output: OutputFile) -> None:
    output.name = redactor.text(output.name)
    if output.encoding == "utf-8":
        output.content = redactor.text(output.content, cut=output.truncated)
    elif output.encoding == "base64" and output.content:
        data = base64.b64decode(output.content)
        redacted = redactor.data(data, cut=output.truncated)
        if redacted != data:
            output.content = base64.b64encode(redacted).decode()


def redacting_sink(store: BaseArtifactStore, scope: str, redactor: Redactor) -> ArtifactSink:
    """The artifact store's sink for ``scope``, storing every file with the secrets taken out of its name and its
    content (text or binary)."""
    sink = store.sink(scope)
    if not redactor:
        return sink

    def save(name: str, fd: int, mime_type: str) -> ArtifactFile:
        data = MeteredReader(lambda size, offset: os.pread(fd, size, offset), name, store.max_bytes).read()
        return store.save_bytes(scope, redactor.text(name), redactor.data(data), mime_type)

    return save
