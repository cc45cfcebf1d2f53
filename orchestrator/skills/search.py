"""``SkillIndex``: BM25 ranking of a library's skills by name and description.

Built once per repository version (the repository keeps it with its scan) and then read by every request: ranking
one query walks only the postings of the query's terms, so it costs microseconds per term whatever the library
size. Terms found in more than half of a library's skills (and in more than ``MIN_COMMON_DF``) are not indexed:
they tell the skills apart no better than a stop word and would cost the most to walk. Each posting carries its precomputed BM25 weight (Okapi BM25, ``k1 = 1.2``, ``b = 0.75``, the idf of
Lucene, which is never negative); a term in the skill's name counts twice.

Queries of any length are accepted: a longer text is cut to its first and last ``MAX_QUERY_CHARS / 2``
characters (where a request's ask usually is, around a pasted document), and at most
``MAX_QUERY_TERMS`` distinct terms — the rarest ones, which carry the most signal — are scored. A query with no
indexed term ranks nothing.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from orchestrator.skills.skill import SkillSummary

K1 = 1.2
B = 0.75
NAME_WEIGHT = 2
MAX_QUERY_CHARS = 4000
MAX_QUERY_TERMS = 32
MIN_COMMON_DF = 20
MAX_LISTED_NAMES = 20  # an unknown-skill error lists a library up to this size, else the closest names
STEM_CACHE_SIZE = 65536  # distinct words whose stem is remembered
_WORD = re.compile(r"[a-z0-9]+")
_STOP_WORDS = frozenset(
    "a an and are as at be but by can could do for from has have help i in into is it its me my need of on or our "
    "please some that the their them then there these they this to use us want was we when which who will with "
    "would you your".split()
)
_SUFFIXES = ("ations", "ation", "ings", "ing", "ies", "ed", "es", "s")


def terms(text: str) -> list[str]:
    """The index terms of ``text``: lowercase words without stop words, with common English endings cut."""
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP_WORDS]


def _ends(text: str) -> str:
    if len(text) <= MAX_QUERY_CHARS:
        return text
    half = MAX_QUERY_CHARS // 2
    return f"{text[:half]} {text[-half:]}"


@lru_cache(maxsize=STEM_CACHE_SIZE)
def _stem(word: str) -> str:
    """A light stemmer: one common ending, then a final ``e`` (``invoices``, ``invoice`` → ``invoic``)."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not (suffix == "s" and word.endswith("ss")):
            word = word[: -len(suffix)] + ("y" if suffix == "ies" else "")
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


@dataclass(frozen=True)
class SkillHit:
    """One ranked skill."""

    summary: SkillSummary
    score: float


class SkillIndex:
    """A BM25 index over ``summaries`` (kept in the given order)."""

    def __init__(self, summaries: Sequence[SkillSummary]) -> None:
        self.summaries = list(summaries)
        self._positions = {s.name: position for position, s in enumerate(self.summaries)}
        docs = [Counter(terms(s.description) + terms(s.name.replace("-", " ")) * NAME_WEIGHT) for s in self.summaries]
        lengths = [sum(doc.values()) for doc in docs]
        average = sum(lengths) / len(lengths) if lengths else 1.0
        frequency: Counter[str] = Counter(term for doc in docs for term in doc)
        count = len(docs)
        self._idf = {t: math.log(1 + (count - df + 0.5) / (df + 0.5)) for t, df in frequency.items()}
        self._postings: dict[str, list[tuple[int, float]]] = {}
        common = {t for t, df in frequency.items() if df > max(MIN_COMMON_DF, count / 2)}
        for term in common:
            del self._idf[term]
        for position, (doc, length) in enumerate(zip(docs, lengths)):
            norm = K1 * (1 - B + B * length / (average or 1.0))
            for term, tf in doc.items():
                if term in common:
                    continue
                weight = self._idf[term] * tf * (K1 + 1) / (tf + norm)
                self._postings.setdefault(term, []).append((position, weight))

    def dump(self) -> dict:
        """What ``restore`` needs to rebuild this index without reading the summaries again (JSON-ready)."""
        return {"idf": self._idf, "postings": self._postings}

    @classmethod
    def restore(cls, summaries: Sequence[SkillSummary], state: dict) -> SkillIndex:
        """The index of ``summaries`` from a ``dump`` of it; ``ValueError`` when ``state`` does not fit them."""
        index = cls.__new__(cls)
        index.summaries = list(summaries)
        index._positions = {s.name: position for position, s in enumerate(index.summaries)}
        idf, postings = state["idf"], state["postings"]
        count = len(index.summaries)
        if not (isinstance(idf, dict) and isinstance(postings, dict) and postings.keys() <= idf.keys()):
            raise ValueError("not an index dump")
        if not all(0 <= position < count for entries in postings.values() for position, _ in entries):
            raise ValueError("an index dump of another library")
        index._idf, index._postings = idf, postings
        return index

    def __len__(self) -> int:
        return len(self.summaries)

    def summary(self, name: str) -> SkillSummary | None:
        position = self._positions.get(name)
        return None if position is None else self.summaries[position]

    def scores(self, query: str, weighted: Iterable[tuple[str, float]] = ()) -> dict[int, float]:
        """Score per skill position for ``query`` plus extra ``(text, weight)`` pairs; unmatched skills are absent."""
        wanted: dict[str, float] = {}
        for text, weight in [(query, 1.0), *weighted]:
            for term in terms(_ends(text)):
                if term in self._idf:
                    wanted[term] = max(wanted.get(term, 0.0), weight)
        if len(wanted) > MAX_QUERY_TERMS:
            kept = heapq.nlargest(MAX_QUERY_TERMS, wanted, key=lambda t: self._idf[t])
            wanted = {t: wanted[t] for t in kept}
        totals: dict[int, float] = {}
        for term, weight in wanted.items():
            for position, value in self._postings[term]:
                totals[position] = totals.get(position, 0.0) + value * weight
        return totals

    def search(self, query: str, limit: int, offset: int = 0, weighted: Iterable[tuple[str, float]] = ()) -> list[SkillHit]:
        """The best ``limit`` matches after skipping ``offset`` (equal scores in a stable order)."""
        totals = self.scores(query, weighted)
        best = heapq.nlargest(offset + limit, totals, key=totals.__getitem__)
        return [SkillHit(self.summaries[p], totals[p]) for p in best[offset:]]

    def closest_names(self, name: str) -> list[str]:
        """What an unknown-skill error offers: every name of a small library, else the closest and how many more."""
        if len(self.summaries) <= MAX_LISTED_NAMES:
            return [s.name for s in self.summaries]
        names = [hit.summary.name for hit in self.search(name.replace("-", " ").replace("_", " "), MAX_LISTED_NAMES // 2)]
        return [*names, f"and {len(self.summaries) - len(names):,} more"]

    def count(self, query: str) -> int:
        """How many skills match ``query`` at all."""
        return len(self.scores(query))
