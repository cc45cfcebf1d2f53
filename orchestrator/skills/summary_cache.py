"""``SummaryCache``: parsed skill summaries kept in a file between processes.

The command line starts a new process per command, so ``skillrun skills list`` would parse every ``SKILL.md`` of a
library each time (most of its time on 2,000 skills). The cache maps each ``SKILL.md`` path to the modification
time and size it had when parsed and the summary parsed from it; a file whose stamp differs is parsed again. The
file is replaced atomically, and an unreadable or foreign cache is ignored (and rewritten), never an error.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from orchestrator.skills.skill import SkillSummary

FORMAT = 1
Stamp = tuple[int, int]
Parsed = Mapping[str, tuple[Stamp, SkillSummary]]


class SummaryCache:
    """The summaries of one set of roots, in the JSON file ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, tuple[Stamp, SkillSummary]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                return {}
            return {
                file: ((int(mtime), int(size)), SkillSummary(name=str(name), description=str(description)))
                for file, (mtime, size, name, description) in data["skills"].items()
            }
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return {}

    def save(self, parsed: Parsed) -> None:
        """Write ``parsed``; a cache that cannot be written only costs the next process its speed."""
        data = {
            "format": FORMAT,
            "skills": {file: [stamp[0], stamp[1], s.name, s.description] for file, (stamp, s) in parsed.items()},
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".summaries-")
        except OSError:
            return
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(data, out)
            os.replace(temporary, self.path)
        except OSError:
            Path(temporary).unlink(missing_ok=True)
