"""``Redactor``: a team's secret values taken out of what its runs give back.

Each secret's value is replaced by ``[redacted:NAME]`` wherever it appears in a run's stdout, stderr, output files
(text and binary, inline and stored as artifacts), file names, refusal reasons, egress refusals and error messages
— every text field of the result (``redact_result`` walks them all) — as it is, and in the forms a command is most
likely to print it in:

* base64, standard and URL-safe alphabets: the characters that depend on the value alone, at each of the three
  alignments the value can have in a longer base64 text (so ``echo -n "x$S" | base64`` is caught too);
* hexadecimal, lower and upper case;
* percent-encoded, as ``urllib.parse.quote`` writes it with and without ``/`` kept, and ``quote_plus``;
* escaped inside a JSON string or a Python ``repr``;
* any of these wrapped: the text is also read with its line breaks (``\\n``, ``\\r\\n`` and their escaped spellings,
  with up to ``MAX_INDENT_CHARS`` of indentation after each) left out, so base64 wrapped at any width and alignment
  (76 columns as ``base64`` and MIME write it, 64 as PEM and ``openssl`` do, 60 as ``xxd -p``) is found, and the
  whole span it covers, line breaks included, is replaced.

Longer forms win where two start at one place. Where output was cut at a cap, the end of what was kept is also
cleared of the start of any form (a value cut in two is not left half shown).

What it costs: every form is looked for at once, by an Aho–Corasick automaton (``pyahocorasick``) of the forms'
first ``ANCHOR_CHARS`` characters; each place an anchor is found is checked against the whole forms that start
with it, unless a match already covers it. So redaction reads a text once, and checks a place at most once per
form with its anchor: linear in the text's size, since a value that repeats a short piece of itself — the one
shape that could make checks overlap — is refused when it is set (``worker.secrets``). Files stream through it a
chunk at a time, holding back only what a match could still span (``redacted_chunks``), so memory does not grow
with a file's size. Building the forms is linear in the team's secrets (at most ``worker.secrets``'
``MAX_TEAM_SECRET_BYTES``), once per run and only when something is redacted. ``work`` counts what was read and
compared, for tests to hold to those bounds without timing.

A command that transforms its secret otherwise (reverses it, encrypts it, prints it a character per line with
other text between) is not caught: redaction keeps honest mistakes out of the model's context, it does not contain
a hostile skill (see the README's security model).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Iterator
from urllib.parse import quote, quote_plus

from worker.redaction.matching import FormFinder, replaced

PLACEHOLDER = "[redacted:{name}]"
MIN_FORM_CHARACTERS = 6
"""Base64 pieces shorter than this are not looked for (they would match ordinary text)."""


class Redactor:
    """Replaces the values of ``secrets`` (name → value) and their encoded forms."""

    def __init__(self, secrets: dict[str, str]) -> None:
        self._secrets = {name: value for name, value in secrets.items() if value}
        self._form_placeholders: dict[str, str] | None = None
        self._text: FormFinder | None = None
        self._bytes: FormFinder | None = None

    def __bool__(self) -> bool:
        return bool(self._secrets)

    @property
    def work(self) -> int:
        """Characters read and compared so far (for tests of the bounds in the module's description)."""
        return sum(family.work for family in (self._text, self._bytes) if family is not None)

    def text(self, text: str, *, cut: bool = False) -> str:
        """``text`` redacted; ``cut``: it ends where a cap cut it, so a form's start at its end goes too."""
        if not self._secrets or not text:
            return text
        return replaced(text, self._text_family().spans(text, cut=cut))

    def data(self, data: bytes, *, cut: bool = False) -> bytes:
        """``data`` redacted as bytes: a form is looked for as its UTF-8 bytes, and everything else is kept byte for
        byte (binary content stays intact except where a form of a value appears)."""
        if not self._secrets or not data:
            return data
        text = data.decode("latin-1")
        return replaced(text, self._bytes_family().spans(text, cut=cut)).encode("latin-1")

    def redacted_chunks(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """``chunks`` (a file, front to back) redacted as ``data`` would redact them joined, holding back only what
        a match may still span (memory: a chunk and twice the longest form's wrapped span)."""
        if not self._secrets:
            yield from chunks
            return
        family = self._bytes_family()
        carry = ""
        for chunk in chunks:
            carry += chunk.decode("latin-1")
            settled = len(carry) - family.hold
            if settled <= family.hold:  # too little yet to settle anything at a bounded cost
                continue
            spans = [span for span in family.spans(carry) if span[0] < settled]
            end = max([settled, *(span_end for _, span_end, _ in spans)])
            yield replaced(carry[:end], [span for span in spans if span[1] <= end]).encode("latin-1")
            carry = carry[end:]
        if carry:
            yield self.data(carry.encode("latin-1"))

    def _text_family(self) -> FormFinder:
        if self._text is None:
            self._text = FormFinder(self._forms())
        return self._text

    def _bytes_family(self) -> FormFinder:
        """The forms as their UTF-8 bytes read as Latin-1 (one character a byte; ASCII forms are the same)."""
        if self._bytes is None:
            self._bytes = FormFinder({form if form.isascii() else form.encode().decode("latin-1"): placeholder
                                   for form, placeholder in self._forms().items()})
        return self._bytes

    def _forms(self) -> dict[str, str]:
        """Every form of every value, with its placeholder (made once, on first use)."""
        if self._form_placeholders is None:
            self._form_placeholders = {}
            for name, value in self._secrets.items():
                for form in forms_of(value):
                    self._form_placeholders.setdefault(form, PLACEHOLDER.format(name=name))
        return self._form_placeholders


def forms_of(value: str) -> set[str]:
    """Every form of ``value`` looked for (see the module's description)."""
    raw = value.encode()
    forms = {value, raw.hex(), raw.hex().upper(), quote(value, safe=""), quote(value), quote_plus(value, safe=""),
             json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], repr(value)[1:-1]}
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        forms |= {piece for piece in _base64_pieces(raw, encode) if len(piece) >= MIN_FORM_CHARACTERS}
    return {form for form in forms if form}


def _base64_pieces(raw: bytes, encode: Callable[[bytes], bytes]) -> set[str]:
    """The base64 characters that depend on ``raw`` alone, for each of its three alignments in a longer text (the
    first and last groups of four, which hold neighbouring bytes, are left out); and the value's own base64."""
    pieces = set()
    for lead in range(3):
        encoded = encode(b"\0" * lead + raw).decode()
        start = 4 if lead else 0
        end = (lead + len(raw)) // 3 * 4
        pieces.add(encoded[start:end])
    whole = encode(raw).decode()
    return pieces | {whole, whole.rstrip("=")}


__all__ = ["MIN_FORM_CHARACTERS", "PLACEHOLDER", "Redactor", "forms_of"]
