"""Finding a set of forms in a text in one pass: where an anchor is found, the longest form there; read as the
text is, and read across its line breaks (so a form wrapped at any width is found as one span of the text).

``Matcher`` holds one set of forms (an Aho–Corasick automaton of their first ``ANCHOR_CHARS`` characters);
``FormFinder`` splits a set between the two readings; ``replaced`` puts placeholders where spans were found.
``worker.redaction.redactor`` says what this costs and why.
"""

from __future__ import annotations

import bisect
import itertools
import re

import ahocorasick

MIN_CUT_CHARACTERS = 4
"""The shortest start of a form cleared from the end of output cut at a cap."""
ANCHOR_CHARS = 16
"""Characters of each form the automaton holds (fewer when a form is shorter): the place a form may start."""
FEW_ANCHORS = 32
"""Up to this many anchors, a text is first searched for each (``str.find`` runs at memory speed, the automaton
at a tenth of it): most texts hold none, and the automaton is not needed."""
REPEATING_CHARS = 4 * ANCHOR_CHARS
"""Forms longer than this whose anchor comes again inside them are looked for on their own (``Matcher``)."""
MAX_INDENT_CHARS = 32
"""Indentation after a line break that reading a wrapped form skips."""
_BREAK = re.compile(r"(?:\r?\n|\\r?\\n)[ \t]{0,%d}" % MAX_INDENT_CHARS)
_BREAK_CHARS = ("\n", "\r", "\\n", "\\r")
_WIDEST_BREAK = 4 + MAX_INDENT_CHARS

Span = tuple[int, int, str]
"""Where a form was found (start, end) and its placeholder."""


class Matcher:
    """Finds a set of forms in a text: where an anchor is found, the longest form with it that is there.

    A long form whose anchor comes again inside it (a value repeating a piece of itself) is looked for on its own,
    with ``str.find`` (linear in CPython): checked at each place its anchor is found, overlapping places could each
    compare most of it."""

    def __init__(self, forms: dict[str, str]) -> None:
        self.placeholders = forms
        self.anchor = min(ANCHOR_CHARS, min(map(len, forms)))
        self._repeating = sorted((form for form in forms
                                  if len(form) > REPEATING_CHARS and form.find(form[:self.anchor], 1) != -1),
                                 key=len, reverse=True)
        groups: dict[str, list[str]] = {}
        for form in set(forms) - set(self._repeating):
            groups.setdefault(form[:self.anchor], []).append(form)
        self._few = list(groups) if len(groups) <= FEW_ANCHORS else None
        self._automaton = ahocorasick.Automaton()
        for anchor, group in groups.items():
            self._automaton.add_word(anchor, tuple(sorted(group, key=len, reverse=True)))
        if groups:
            self._automaton.make_automaton()
        self.longest = max(map(len, forms))
        self._starts = {}
        for form in sorted(forms, key=len):  # the longest form's placeholder wins a shared start
            for length in range(MIN_CUT_CHARACTERS, min(len(form), self.anchor)):
                self._starts[form[:length]] = forms[form]
        self.work = 0

    def spans(self, text: str, *, cut: bool = False) -> list[Span]:
        """The forms in ``text``, leftmost and longest first (overlapping ones are replaced as one); with ``cut``,
        the start of a form at the end of ``text`` too."""
        found: list[Span] = []
        reach = 0
        size = len(text)
        self.work += size
        hits = ()
        if self._automaton.kind == ahocorasick.AHOCORASICK:
            self.work += len(self._few or ()) * size
            if self._few is None or any(anchor in text for anchor in self._few):
                hits = self._automaton.iter(text)
        for last, group in hits:
            start = last - self.anchor + 1
            if start < reach:
                continue
            rest = None
            for form in group:
                self.work += len(form)
                if text.startswith(form, start):
                    found.append((start, start + len(form), self.placeholders[form]))
                    reach = start + len(form)
                    break
                if cut and start + len(form) > size:
                    rest = text[start:] if rest is None else rest
                    if form.startswith(rest):
                        found.append((start, size, self.placeholders[form]))
                        reach = size
                        break
        for form in self._repeating:
            found += self._each(text, form, cut)
        if cut and reach < size:
            for length in range(min(self.anchor - 1, size - reach), MIN_CUT_CHARACTERS - 1, -1):
                placeholder = self._starts.get(text[size - length:])
                if placeholder is not None:
                    found.append((size - length, size, placeholder))
                    break
        return found

    def _each(self, text: str, form: str, cut: bool) -> list[Span]:
        """Every place of ``form`` in ``text``; with ``cut``, its longest start ending ``text`` (found by the
        prefix function over the last ``len(form)`` characters: linear however the form repeats)."""
        found: list[Span] = []
        self.work += len(text) + len(form)
        start = text.find(form)
        while start != -1:
            found.append((start, start + len(form), self.placeholders[form]))
            start = text.find(form, start + len(form))
        if cut:
            tail = text[max(len(text) - len(form) + 1, found[-1][1] if found else 0):]
            length = _longest_start_at_end(form, tail)
            self.work += len(form) + len(tail)
            if length >= MIN_CUT_CHARACTERS:
                found.append((len(text) - length, len(text), self.placeholders[form]))
        return found


def _longest_start_at_end(form: str, text: str) -> int:
    """The length of the longest start of ``form`` that ``text`` ends with (Knuth–Morris–Pratt)."""
    border = [0] * len(form)
    length = 0
    for index in range(1, len(form)):
        while length and form[index] != form[length]:
            length = border[length - 1]
        if form[index] == form[length]:
            length += 1
        border[index] = length
    length = 0
    for char in text:
        while length and (length == len(form) or char != form[length]):
            length = border[length - 1]
        if char == form[length]:
            length += 1
    return length


class FormFinder:
    """The forms of one alphabet (text, or bytes read as Latin-1): those read across line breaks (``wrapped``)
    and those with a line break or leading blank of their own, read as the text is (``lined``)."""

    def __init__(self, forms: dict[str, str]) -> None:
        lined = {form: p for form, p in forms.items() if any(b in form for b in _BREAK_CHARS) or form[0] in " \t"}
        wrapped = {form: p for form, p in forms.items() if form not in lined}
        self.lined = Matcher(lined) if lined else None
        self.wrapped = Matcher(wrapped) if wrapped else None
        self.hold = max((self.lined.longest if self.lined else 0),
                        (self.wrapped.longest * (1 + _WIDEST_BREAK) if self.wrapped else 0))
        """The most characters of a text one match may span (a wrapped form one character a line)."""

    @property
    def work(self) -> int:
        return sum(matcher.work for matcher in (self.lined, self.wrapped) if matcher is not None)

    def spans(self, text: str, *, cut: bool = False) -> list[Span]:
        spans = self.lined.spans(text, cut=cut) if self.lined else []
        if self.wrapped is not None:
            spans += _unwrapped_spans(self.wrapped, text, cut)
        return sorted(spans)


def _unwrapped_spans(matcher: Matcher, text: str, cut: bool) -> list[Span]:
    """``matcher``'s forms in ``text`` read without its line breaks, as spans of ``text``."""
    unbroken = _Unbroken.of(text)
    if unbroken is None:
        return matcher.spans(text, cut=cut)
    return [(unbroken.where(start), unbroken.where(end - 1) + 1, placeholder)
            for start, end, placeholder in matcher.spans(unbroken.text, cut=cut)]


class _Unbroken:
    """A text read without its line breaks (``_BREAK``): the pieces between them joined (``text``), and where each
    piece starts in both (for ``where``, worked out on its first use: most texts hold no form). Plain line breaks
    are split in C; indentation after them, carriage returns and escaped breaks take a pass over the pieces or the
    pattern."""

    def __init__(self, text: str, kept: list[str] | list[tuple[int, int]]) -> None:
        self.text = text
        self._kept = kept
        self._joined_at: list[int] = []
        self._original_at: list[int] = []

    @classmethod
    def of(cls, text: str) -> _Unbroken | None:
        """``None`` when ``text`` has no line break."""
        if "\\" in text and ("\\n" in text or "\\r" in text):
            kept, position = [], 0
            for found in _BREAK.finditer(text):
                kept.append((position, found.start()))
                position = found.end()
            return cls._of_spans(text, [*kept, (position, len(text))]) if kept else None
        if "\n" not in text:
            return None
        pieces = text.split("\n")
        if "\r" not in text and "\n " not in text and "\n\t" not in text:
            return cls("".join(pieces), pieces)  # each piece whole, one character of break after each
        kept, position, last = [], 0, len(pieces) - 1
        for index, piece in enumerate(pieces):
            start, end = position, position + len(piece)
            position = end + 1
            if index:
                start += min(len(piece) - len(piece.lstrip(" \t")), MAX_INDENT_CHARS)
            if index < last and piece.endswith("\r"):
                end -= 1
            kept.append((start, max(start, end)))
        return cls._of_spans(text, kept)

    @classmethod
    def _of_spans(cls, text: str, kept: list[tuple[int, int]]) -> _Unbroken:
        return cls("".join(text[start:end] for start, end in kept), kept)

    def where(self, index: int) -> int:
        """Where the character at ``index`` of the joined text is in the original."""
        if not self._joined_at:
            if isinstance(self._kept[0], str):
                self._joined_at = [0, *itertools.accumulate(map(len, self._kept))][:-1]
                self._original_at = [joined + piece for piece, joined in enumerate(self._joined_at)]
            else:
                self._joined_at = [0, *itertools.accumulate(end - start for start, end in self._kept)][:-1]
                self._original_at = [start for start, _ in self._kept]
        piece = bisect.bisect_right(self._joined_at, index) - 1
        return self._original_at[piece] + index - self._joined_at[piece]


def replaced(text: str, spans: list[Span]) -> str:
    """``text`` with each span (sorted by start) replaced by its placeholder; overlapping spans replaced as one."""
    out: list[str] = []
    position = 0
    for start, end, placeholder in spans:
        if end <= position:
            continue
        if start < position:  # overlaps the span just replaced: what is left of it goes too
            start = position
        else:
            out.append(text[position:start])
            out.append(placeholder)
        position = end
    out.append(text[position:])
    return "".join(out)


__all__ = ["ANCHOR_CHARS", "MAX_INDENT_CHARS", "MIN_CUT_CHARACTERS", "FormFinder", "Matcher", "Span", "replaced"]
