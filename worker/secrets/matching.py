"""Finding a set of forms in a text in one pass: where an anchor is found, the longest form there; read as the
text is, and read across its line breaks (so a form wrapped at any width is found as one span of the text).

``Matcher`` holds one set of forms: an Aho–Corasick automaton of their first ``ANCHOR_CHARS`` characters, and
under each anchor a tree of the forms' further characters, ``TREE_CHARS`` at a step (``_Branch``), so a place an
anchor is found is checked in as many steps as the text there goes on like some form, however many forms share
that start (a hundred JWTs sharing their header, values sharing a prefix). ``FormFinder`` splits a set between
the two readings; ``replaced`` puts placeholders where spans were found. ``worker.secrets.redactor`` says what
this costs and why.
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
TREE_CHARS = 16
"""Characters of the forms one step of a ``_Branch`` reads."""
FEW_ANCHORS = 32
"""Up to this many anchors, a text is first searched for each (``str.find`` runs at memory speed, the automaton
at a tenth of it): most texts hold none, and the automaton is not needed."""
SELF_OVERLAP_CHARS = 4 * ANCHOR_CHARS
"""A value one of whose forms' first this many characters come again right after (``repeats_near_its_start``) is
refused: otherwise checking a place its anchor is found reads about this and a step more, however the text goes."""
REPEATING_CHARS = 16 * ANCHOR_CHARS
"""Forms whose first this many characters come again inside them are looked for on their own (``repeats``)."""
MAX_INDENT_CHARS = 32
"""Indentation after a line break that reading a wrapped form skips."""
_BREAK = re.compile(r"(?:\r?\n|(?:\\r)?\\n)[ \t]{0,%d}" % MAX_INDENT_CHARS)
"""A line break: plain (LF, CRLF) or escaped as JSON and ``repr`` write it (``\\n``, ``\\r\\n``), and the
indentation after it."""
_BREAK_CHARS = ("\n", "\r", "\\n", "\\r")
WIDEST_BREAK = 4 + MAX_INDENT_CHARS


def repeats_near_its_start(form: str) -> bool:
    """Whether ``form``'s first ``SELF_OVERLAP_CHARS`` come again within as many characters after its start (its
    start is a piece of fewer characters repeated): places an anchor of it is found at, overlapping, can then each
    go on like it for as long as that piece repeats. Values like this are refused when set (``worker.secrets.store``);
    one stored before is still found, at that cost, or by ``str.find`` (``repeats``). A start that comes again
    further on (a chain of certificates, each with its header) costs nothing more: places that far apart do not
    overlap."""
    return len(form) > SELF_OVERLAP_CHARS and form.find(form[:SELF_OVERLAP_CHARS], 1, 2 * SELF_OVERLAP_CHARS) != -1


def repeats(form: str) -> bool:
    """Whether ``form``'s first ``REPEATING_CHARS`` come again inside it (a value repeating a piece of itself, stored
    before such values were refused): it is then looked for with ``str.find`` rather than checked at each place."""
    return len(form) > REPEATING_CHARS and form.find(form[:REPEATING_CHARS], 1) != -1


Span = tuple[int, int, str]
"""Where a form was found (start, end) and its placeholder."""


class _Branch:
    """The forms that share their first ``depth`` characters: those ending within the next ``TREE_CHARS`` (``ends``:
    by length, then by the characters they end with) and those going on (``next``: by their next ``TREE_CHARS``)."""

    __slots__ = ("depth", "ends", "next", "form")

    def __init__(self, depth: int, form: str) -> None:
        self.depth = depth
        self.ends: dict[int, dict[str, str]] = {}
        self.next: dict[str, _Branch] = {}
        self.form = form
        """One form below (its placeholder marks a cut start)."""

    def add(self, form: str) -> None:
        branch = self
        while len(form) - branch.depth >= TREE_CHARS:
            key = form[branch.depth:branch.depth + TREE_CHARS]
            below = branch.next.get(key)
            if below is None:
                below = branch.next[key] = _Branch(branch.depth + TREE_CHARS, form)
            branch = below
        branch.ends.setdefault(len(form), {})[form[branch.depth:]] = form

    def longest(self, text: str, start: int, cut: bool) -> tuple[str | None, bool, int]:
        """The longest form at ``start`` of ``text`` (``None``: none); whether, with ``cut``, the text ends inside a
        longer one; and the characters read."""
        branch, best, read, size = self, None, 0, len(text)
        while True:
            at = start + branch.depth
            for length, tails in branch.ends.items():
                read += length - branch.depth
                form = tails.get(text[at:start + length]) if start + length <= size else None
                if form is not None and (best is None or length > len(best)):
                    best = form
            if at + TREE_CHARS > size:
                rest = text[at:]
                cut_inside = cut and (any(key.startswith(rest) for key in branch.next) or any(
                    len(tail) > len(rest) and tail.startswith(rest) for tails in branch.ends.values() for tail in tails))
                return best, cut_inside, read + len(rest)
            below = branch.next.get(text[at:at + TREE_CHARS])
            read += TREE_CHARS
            if below is None:
                return best, False, read
            branch = below


class Matcher:
    """Finds a set of forms in a text: where an anchor is found, the longest form with it that is there (``_Branch``).

    A form that repeats itself (``repeats``) is looked for on its own, with ``str.find`` (linear in CPython): checked
    at each place its anchor is found, overlapping places could each compare most of it.
    ``heads``: the forms whose start is cleared from a cut end even when shorter than an anchor (the starts of
    values' forms, not the pieces of long ones that follow a first)."""

    def __init__(self, forms: dict[str, str], heads: set[str] | None = None) -> None:
        self.placeholders = forms
        self.anchor = min(ANCHOR_CHARS, min(map(len, forms)))
        self._repeating = sorted((form for form in forms if repeats(form)), key=len, reverse=True)
        branches: dict[str, _Branch] = {}
        for form in sorted(set(forms) - set(self._repeating)):
            anchor = form[:self.anchor]
            branches.setdefault(anchor, _Branch(self.anchor, form)).add(form)
        self._few = list(branches) if len(branches) <= FEW_ANCHORS else None
        self._automaton = ahocorasick.Automaton()
        for anchor, branch in branches.items():
            self._automaton.add_word(anchor, branch)
        if branches:
            self._automaton.make_automaton()
        self.longest = max(map(len, forms))
        self._starts = {}
        for form in sorted(forms if heads is None else heads & set(forms), key=len):  # the longest's placeholder wins
            for length in range(MIN_CUT_CHARACTERS, min(len(form), self.anchor)):
                self._starts[form[:length]] = forms[form]
        self.work = 0

    def spans(self, text: str, *, cut: bool = False) -> list[Span]:
        """The forms in ``text``, leftmost and longest first (overlapping ones are replaced as one); with ``cut``,
        the start of a form at the end of ``text`` too. A place inside a match is checked again only for forms of
        another anchor (one that goes on past the match); the same anchor again inside its own match is that form
        overlapping itself, which ``repeats`` keeps out of the automaton."""
        found: list[Span] = []
        reach = 0
        size = len(text)
        self.work += size
        hits = ()
        if self._automaton.kind == ahocorasick.AHOCORASICK:
            self.work += len(self._few or ()) * size
            if self._few is None or any(anchor in text for anchor in self._few):
                hits = self._automaton.iter(text)
        matched: _Branch | None = None
        for last, branch in hits:
            start = last - self.anchor + 1
            if start < reach and branch is matched:
                continue
            form, cut_inside, read = branch.longest(text, start, cut)
            self.work += read
            if cut_inside:
                found.append((start, size, self.placeholders[branch.form]))
                reach, matched = size, branch
            elif form is not None and start + len(form) > reach:
                found.append((start, start + len(form), self.placeholders[form]))
                reach, matched = start + len(form), branch
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
    """The forms of one alphabet (text, or bytes read as Latin-1): those read across line breaks (``wrapped``),
    and, read as the text is, those with a line break or leading blank of their own and those that repeat
    themselves past ``wrapped_chars`` (``lined``: what one match of them spans stays their length). Where a text
    holds escaped breaks (``\\n``), the wrapped forms are looked for in it as it is too: taking such a break out
    may take a form's own character with it (``C:\\\\nvapi-…``)."""

    def __init__(self, forms: dict[str, str], heads: set[str] | None = None, *, wrapped_chars: int) -> None:
        lined = {form: p for form, p in forms.items() if any(b in form for b in _BREAK_CHARS) or form[0] in " \t"
                 or (len(form) > wrapped_chars and repeats(form))}
        wrapped = {form: p for form, p in forms.items() if form not in lined}
        self.lined = Matcher(lined, heads) if lined else None
        self.wrapped = Matcher(wrapped, heads) if wrapped else None
        self.hold = max((self.lined.longest if self.lined else 0),
                        (self.wrapped.longest * (1 + WIDEST_BREAK) if self.wrapped else 0))
        """The most characters of a text one match may span (a wrapped form one character a line)."""

    @property
    def work(self) -> int:
        return sum(matcher.work for matcher in (self.lined, self.wrapped) if matcher is not None)

    def spans(self, text: str, *, cut: bool = False) -> list[Span]:
        spans = self.lined.spans(text, cut=cut) if self.lined else []
        if self.wrapped is not None:
            unbroken = _Unbroken.of(text)
            if unbroken is None or unbroken.escaped:
                spans += self.wrapped.spans(text, cut=cut)
            if unbroken is not None:
                spans += [(unbroken.where(start), unbroken.where(end - 1) + 1, placeholder)
                          for start, end, placeholder in self.wrapped.spans(unbroken.text, cut=cut)]
        return sorted(spans)


class _Unbroken:
    """A text read without its line breaks (``_BREAK``): the pieces between them joined (``text``), and where each
    piece starts in both (for ``where``, worked out on its first use: most texts hold no form). Plain line breaks
    are split in C; indentation after them, carriage returns and escaped breaks take a pass over the pieces or the
    pattern."""

    def __init__(self, text: str, kept: list[str] | list[tuple[int, int]], escaped: bool = False) -> None:
        self.text = text
        self.escaped = escaped
        """Whether escaped breaks were taken out (then a form's own character may have gone with one)."""
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
            return cls._of_spans(text, [*kept, (position, len(text))], escaped=True) if kept else None
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
    def _of_spans(cls, text: str, kept: list[tuple[int, int]], escaped: bool = False) -> _Unbroken:
        return cls("".join(text[start:end] for start, end in kept), kept, escaped)

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


__all__ = ["ANCHOR_CHARS", "MAX_INDENT_CHARS", "MIN_CUT_CHARACTERS", "WIDEST_BREAK", "FormFinder", "Matcher", "Span",
           "repeats", "replaced"]
