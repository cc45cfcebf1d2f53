"""``FilteredSkillRepository``: the part of a library one agent may see at all.

An agent given a filtered repository (as its ``skill_repository`` and its ``SkillToolSet``'s) sees only the
skills whose name matches one of ``names`` (shell patterns such as ``"data-*"``) and that come from one of
``roots`` (the team libraries, as given to the repository: a folder or a URL); either left ``None`` lets
everything through. Hidden skills are absent from the overview, ``skill_list`` and ``skill_search``, and loading or
running one fails as for an unknown skill. The visible set and its index are computed once per version of the
underlying repository.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from orchestrator.errors import SkillNotFoundError
from orchestrator.skills.repository import BaseSkillRepository, SkillProblem
from orchestrator.skills.search import SkillIndex
from orchestrator.skills.skill import Skill, SkillSummary
from worker.contract import SkillRef
from worker.roots import is_url, split_pin


class FilteredSkillRepository(BaseSkillRepository):
    """The skills of ``repository`` that match ``names`` and come from ``roots``."""

    def __init__(
        self,
        repository: BaseSkillRepository,
        *,
        names: str | Sequence[str] | None = None,
        roots: Sequence[str | os.PathLike[str]] | None = None,
    ) -> None:
        super().__init__(repository.workspace_runtime)
        if names is not None and not names:
            raise ValueError("names: give at least one pattern, or None to let every name through")
        if roots is not None and not roots:
            raise ValueError("roots: give at least one root, or None to let every root through")
        self.repository = repository
        self.names = [names] if isinstance(names, str) else None if names is None else list(names)
        self.roots = None if roots is None else {_root_key(os.fspath(r)) for r in roots}
        self._source: SkillIndex | None = None
        self._index = SkillIndex([])

    def _visible(self, summary: SkillSummary) -> bool:
        if self.names is not None and not any(fnmatchcase(summary.name, p) for p in self.names):
            return False
        return self.roots is None or _root_key(self.repository.skill_ref(summary.name).root) in self.roots

    def index(self) -> SkillIndex:
        source = self.repository.index()
        if source is not self._source:
            self._index = SkillIndex([s for s in source.summaries if self._visible(s)])
            self._source = source
        return self._index

    def summaries(self) -> list[SkillSummary]:
        return list(self.index().summaries)

    def _check(self, name: str) -> None:
        index = self.index()
        if index.summary(name) is None:
            raise SkillNotFoundError(name, index.closest_names(name))

    def get(self, name: str) -> Skill:
        self._check(name)
        return self.repository.get(name)

    def path(self, name: str) -> Path:
        self._check(name)
        return self.repository.path(name)

    def skill_ref(self, name: str) -> SkillRef:
        self._check(name)
        return self.repository.skill_ref(name)

    def problems(self) -> list[SkillProblem]:
        return self.repository.problems()


def _root_key(root: str) -> str:
    """A root as the repository reports it: a remote URL without its pin, else the resolved local path."""
    if root.startswith("file:"):
        return str(Path(url2pathname(urlparse(root).path)).resolve())
    return split_pin(root)[0] if is_url(root) else str(Path(root).resolve())
