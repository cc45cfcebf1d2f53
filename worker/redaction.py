"""``Redactor``: a run's secret values taken out of what the run gives back.

Each secret's value is replaced by ``[redacted:NAME]`` wherever it appears in the run's stdout, stderr, text output
files and text artifacts — as it is, and in the forms a command is most likely to print it in:

* base64, standard and URL-safe alphabets: the characters that depend on the value alone, at each of the three
  alignments the value can have in a longer base64 text (so ``echo -n "x$S" | base64`` is caught too);
* hexadecimal, lower and upper case;
* percent-encoded, as ``urllib.parse.quote`` and ``quote_plus`` write it.

Longer forms are replaced first, so a form that contains another is replaced whole. A command that transforms its
secret otherwise (reverses it, encrypts it, prints it a character per line) is not caught: redaction keeps honest
mistakes out of the model's context, it does not contain a hostile skill (see the README's security model).
"""

from __future__ import annotations

import base64
import os
import re
from urllib.parse import quote, quote_plus

from worker.artifacts.base import BaseArtifactStore, MeteredReader
from worker.collect import ArtifactSink
from worker.contract import ArtifactFile, RunResult
from worker.mime import is_text

PLACEHOLDER = "[redacted:{name}]"
TEXT_SNIFF_BYTES = 8192
MIN_FORM_CHARACTERS = 6
"""Base64 pieces shorter than this are not looked for (they would match ordinary text)."""


class Redactor:
    """Replaces the values of ``secrets`` (name → value) and their encoded forms."""

    def __init__(self, secrets: dict[str, str]) -> None:
        forms: dict[str, str] = {}
        for name, value in secrets.items():
            for form in _forms(value):
                forms.setdefault(form, PLACEHOLDER.format(name=name))
        self._forms = forms
        ordered = sorted(forms, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def text(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(lambda match: self._forms[match.group(0)], text)

    def data(self, data: bytes) -> bytes:
        """``data`` redacted as UTF-8 text (bytes that are not UTF-8 are kept as they are)."""
        if self._pattern is None or not data:
            return data
        return self.text(data.decode("utf-8", errors="surrogateescape")).encode("utf-8", errors="surrogateescape")


def _forms(value: str) -> set[str]:
    raw = value.encode()
    forms = {value, raw.hex(), raw.hex().upper(), quote(value, safe=""), quote_plus(value, safe="")}
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        forms |= {piece for piece in _base64_pieces(raw, encode) if len(piece) >= MIN_FORM_CHARACTERS}
    return {form for form in forms if form}


def _base64_pieces(raw: bytes, encode) -> set[str]:  # noqa: ANN001 - base64's encoders
    """The base64 characters that depend on ``raw`` alone, for each of its three alignments in a longer text (the
    first and last groups of four, which hold neighbouring bytes, are left out)."""
    pieces = set()
    for lead in range(3):
        encoded = encode(b"\0" * lead + raw).decode()
        start = 4 if lead else 0
        end = (lead + len(raw)) // 3 * 4
        pieces.add(encoded[start:end])
    whole = encode(raw).decode()  # the value encoded on its own, with its padding and without
    pieces |= {whole, whole.rstrip("=")}
    return pieces


def redact_result(result: RunResult, redactor: Redactor) -> None:
    """Take the secrets out of a result in place: stdout, stderr, and the inline content of text output files."""
    if not redactor:
        return
    result.stdout = redactor.text(result.stdout)
    result.stderr = redactor.text(result.stderr)
    for output in result.output_files:
        if output.encoding == "utf-8":
            output.content = redactor.text(output.content)


def redacting_sink(store: BaseArtifactStore, scope: str, redactor: Redactor) -> ArtifactSink:
    """The artifact store's sink for ``scope``, storing text files with the secrets taken out (binary files as
    they are)."""
    sink = store.sink(scope)
    if not redactor:
        return sink

    def save(name: str, fd: int, mime_type: str) -> ArtifactFile:
        if not is_text(mime_type, os.pread(fd, TEXT_SNIFF_BYTES, 0)):
            return sink(name, fd, mime_type)
        data = MeteredReader(lambda size, offset: os.pread(fd, size, offset), name, store.max_bytes).read()
        return store.save_bytes(scope, name, redactor.data(data), mime_type)

    return save
