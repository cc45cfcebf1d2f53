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

Longer forms win where two start at one place, and two forms that overlap in the text are replaced as one. Where
output was cut at a cap, the end of what was kept is also cleared of the start of any form (a value cut in two is
not left half shown).

What it costs: every form is looked for at once, by an Aho–Corasick automaton (``pyahocorasick``) of the forms'
first ``ANCHOR_CHARS`` characters; each place an anchor is found is checked by walking a tree of the forms with
that anchor, ``TREE_CHARS`` at a step, as far as the text goes on like one of them — so however many forms share a
start (a team's hundred JWTs and their common header), a place costs about as many characters as the text there
goes on like a form. A place inside a match of the same anchor is not checked again; and a value whose start is a
short piece repeated, the one shape that makes such places overlap and each read on for long, is refused when it is
set (``worker.secrets.store``). So redaction is linear in the text's size. A form longer than ``PIECE_CHARS`` is looked for
in pieces (``pieces_of``), so what one match spans is bounded however long the value; the text is redacted in steps
of ``STEP_CHARS`` and what a match starting in one may still span (``_stepped``), whether it is a stdout in memory
or a file streamed into the artifact store, so memory is a step's, whatever the text's size and however dense its
line breaks, and a file streamed in any chunks comes out as it does whole. Building the forms is linear in the
team's secrets (at most ``worker.secrets.store``' ``MAX_TEAM_SECRET_BYTES``), once per run and only when something is
redacted. ``work`` counts what was read and compared, for tests to hold to those bounds without timing.

A command that transforms its secret otherwise (reverses it, encrypts it, prints it a character per line with
other text between) is not caught: redaction keeps honest mistakes out of the model's context, it does not contain
a hostile skill (see the README's security model).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Iterator
from urllib.parse import quote, quote_plus

from worker.secrets.matching import ANCHOR_CHARS, FormFinder, repeats, replaced

PLACEHOLDER = "[redacted:{name}]"
MIN_FORM_CHARACTERS = 6
"""Base64 pieces shorter than this are not looked for (they would match ordinary text)."""
PIECE_CHARS = 1024
"""A form longer than this is looked for in pieces (``pieces_of``)."""
STEP_CHARS = 256 * 1024
"""Characters a step of redaction settles at least (``_stepped``): what it holds is a few times this."""


class Redactor:
    """Replaces the values of ``secrets`` (name → value) and their encoded forms."""

    def __init__(self, secrets: dict[str, str]) -> None:
        self._secrets = {name: value for name, value in secrets.items() if value}
        self._pieces: tuple[dict[str, str], set[str]] | None = None
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
        return "".join(_stepped(self._text_family(), [text], cut))

    def data(self, data: bytes, *, cut: bool = False) -> bytes:
        """``data`` redacted as bytes: a form is looked for as its UTF-8 bytes, and everything else is kept byte for
        byte (binary content stays intact except where a form of a value appears)."""
        if not self._secrets or not data:
            return data
        return "".join(_stepped(self._bytes_family(), [data.decode("latin-1")], cut)).encode("latin-1")

    def redacted_chunks(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """``chunks`` (a file, front to back) redacted as ``data`` redacts them joined, a step at a time
        (``_stepped``: memory a step's characters, whatever the file's size)."""
        if not self._secrets:
            yield from chunks
            return
        for redacted in _stepped(self._bytes_family(), (chunk.decode("latin-1") for chunk in chunks), cut=False):
            yield redacted.encode("latin-1")

    def _text_family(self) -> FormFinder:
        if self._text is None:
            forms, heads = self._forms()
            self._text = FormFinder(forms, heads, wrapped_chars=PIECE_CHARS)
        return self._text

    def _bytes_family(self) -> FormFinder:
        """The forms as their UTF-8 bytes read as Latin-1 (one character a byte; ASCII forms are the same)."""
        if self._bytes is None:
            forms, heads = self._forms()
            as_bytes = {form: form if form.isascii() else form.encode().decode("latin-1") for form in forms}
            self._bytes = FormFinder({as_bytes[form]: placeholder for form, placeholder in forms.items()},
                                     {as_bytes[form] for form in heads}, wrapped_chars=PIECE_CHARS)
        return self._bytes

    def _forms(self) -> tuple[dict[str, str], set[str]]:
        """What is looked for, with its placeholders (made once, on first use): every form of every value, one
        longer than ``PIECE_CHARS`` as its pieces (``pieces_of``); and the starts of forms among them (a cut end
        is cleared of a start shorter than an anchor of these alone)."""
        if self._pieces is None:
            looked_for: dict[str, str] = {}
            heads: set[str] = set()
            for name, value in self._secrets.items():
                for form in forms_of(value):
                    pieces = pieces_of(form)
                    heads.add(pieces[0])
                    for piece in pieces:
                        looked_for.setdefault(piece, PLACEHOLDER.format(name=name))
            self._pieces = looked_for, heads
        return self._pieces


def pieces_of(form: str) -> list[str]:
    """``form`` as what is looked for: itself, or, longer than ``PIECE_CHARS`` and not repeating itself, its pieces
    of ``PIECE_CHARS`` characters each reaching ``ANCHOR_CHARS`` into the next (the last ending the form), so a
    match spans a bounded text however long the value, a form cut anywhere leaves a piece's start of an anchor or
    more to clear, and every piece of a form printed whole is found. A form that repeats itself is found whole (by
    ``str.find``, in the text as it is)."""
    if len(form) <= PIECE_CHARS + ANCHOR_CHARS or repeats(form):
        return [form]
    size = PIECE_CHARS + ANCHOR_CHARS
    pieces = [form[start:start + size] for start in range(0, len(form) - size, PIECE_CHARS)]
    return [*pieces, form[-size:]]


def _stepped(family: FormFinder, texts: Iterable[str], cut: bool) -> Iterator[str]:
    """``texts`` (one text in pieces) redacted a step at a time. A step reads the next ``step`` characters from where
    the last one settled and ``2 * family.hold`` more (what a match starting in it may still span), replaces what
    starts in its first ``step``, and settles there or at the end of a match crossing it. Steps depend on the
    characters alone, not on how they came, so a file streamed in any chunks is redacted as it is whole; the last
    step, at the end of the text, is ``cut``'s."""
    step = max(STEP_CHARS, 2 * family.hold)
    size = step + 2 * family.hold
    held: list[str] = []
    count = 0
    for text in texts:
        held.append(text)
        count += len(text)
        if count < size:
            continue
        carry = "".join(held)
        while len(carry) >= size:
            window = carry[:size]
            spans = family.spans(window)
            settled = max([step, *(end for start, end, _ in spans if start < step)])
            yield replaced(window[:settled], [span for span in spans if span[0] < step])
            carry = carry[settled:]
        held, count = [carry], len(carry)
    rest = "".join(held)
    if rest:
        yield replaced(rest, family.spans(rest, cut=cut))


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


__all__ = ["MIN_FORM_CHARACTERS", "PIECE_CHARS", "PLACEHOLDER", "STEP_CHARS", "Redactor", "forms_of", "pieces_of"]
