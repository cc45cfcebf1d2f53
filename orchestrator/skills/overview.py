"""The overview tier, bounded: every skill while the library is small, the most relevant ones past a size.

While the ``- name: description`` lines of all skills fit in ``SkillOptions.overview_max_chars`` the overview is
every skill, as it always was. Past that it is cut: the ``overview_skills`` skills that best match the conversation
(the latest user message, and with half the weight the loaded skills) with their descriptions, the next
``overview_names`` by name only, and a line saying how many more exist and how to find them (``skill_search``,
which ``SkillToolSet`` declares exactly when the overview is cut). Both parts stay within the character budget,
so a request's overview costs the same for 50 skills or 5,000.

The complete text and the search index are built once per repository version and shared by every request;
per request only the ranking runs (see ``SkillIndex``).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.skills.options import SkillOptions
from orchestrator.skills.search import SkillIndex
from orchestrator.skills.skill import SkillSummary

LOADED_WEIGHT = 0.5
_full_text: weakref.WeakKeyDictionary[SkillIndex, str] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Overview:
    """The overview lines of one request, and what they leave out."""

    text: str
    cut: bool
    described: list[str]
    named: list[str]
    total: int


def _line(summary: SkillSummary) -> str:
    return f"- {summary.name}: {summary.description}"


def full_overview(index: SkillIndex) -> str:
    """Every skill's line (computed once per index)."""
    text = _full_text.get(index)
    if text is None:
        text = _full_text[index] = "\n".join(_line(s) for s in index.summaries)
    return text


def is_cut(index: SkillIndex, options: SkillOptions) -> bool:
    """Whether the library is past the size at which the overview stops listing every skill."""
    return len(full_overview(index)) > options.overview_max_chars


def build_overview(
    index: SkillIndex, options: SkillOptions, query: str, loaded: Sequence[SkillSummary] = (), search_tool: bool = True
) -> Overview:
    """The overview for a conversation whose latest user message is ``query``."""
    total = len(index)
    if not is_cut(index, options):
        names = [s.name for s in index.summaries]
        return Overview("Available skills:\n" + (full_overview(index) or "- (none)"), False, names, [], total)
    weighted = [(f"{s.name.replace('-', ' ')} {s.description}", LOADED_WEIGHT) for s in loaded]
    wanted = options.overview_skills + options.overview_names
    hits = index.search(query, max(wanted, 1), weighted=weighted)  # one at least: whether anything matches
    budget = options.overview_max_chars
    lines: list[str] = []
    described: list[str] = []
    for hit in hits[: options.overview_skills]:
        line = _line(hit.summary)
        if len(line) + 1 > budget:
            break
        budget -= len(line) + 1
        lines.append(line)
        described.append(hit.summary.name)
    named: list[str] = []
    for hit in hits[len(described):wanted]:
        if len(hit.summary.name) + 2 > budget:
            break
        budget -= len(hit.summary.name) + 2
        named.append(hit.summary.name)
    shown = len(described) + len(named)
    how = " Find them with skill_search(query=...)." if search_tool else ""
    if described:
        head = f"Available skills (the {len(described)} of {total:,} most relevant to this conversation):"
    elif hits:
        head = f"Available skills: {total:,} exist; none is described here."
    else:
        head = f"Available skills: none of the {total:,} matches this conversation yet."
    parts = [head, *lines]
    if named:
        parts.append(f"Also relevant, by name: {', '.join(named)}.")
    if shown < total:
        parts.append(f"{total - shown:,} {'more ' if shown else ''}skills are not listed.{how}")
    return Overview("\n".join(parts), True, described, named, total)
