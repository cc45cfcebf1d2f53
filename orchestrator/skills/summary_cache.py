"""``SummaryCache``: parsed skill summaries kept in a file between processes.

The command line starts a new process per command, so ``skillrun skills list`` would parse every ``SKILL.md`` of a
library each time (most of its time on 2,000 skills). The cache maps each ``SKILL.md`` path to the stamp it had when
parsed (``Stamp``) and the summary parsed from it; a file whose stamp differs is parsed again. The file is not
trusted: a summary read back passes the same checks as a parsed one, and the file is read only if it is a regular
file of at most ``MAX_FILE_BYTES``.
``--search`` would likewise index the whole library each time: the search index is kept in a second file with the
digest of the summaries it was built from, and read back only for the same summaries. Files are replaced
atomically, and an unreadable or foreign one is ignored (and rewritten), never an error. A folder of caches keeps
the ``MAX_CACHES`` most recently used sets of roots: saving one removes the others (and temporary files of killed
writers older than ``LEFTOVER_SECONDS``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from orchestrator.errors import SkillValidationError
from orchestrator.skills.search import SkillIndex
from orchestrator.skills.skill import SkillSummary, read_regular_file, validate_summary

FORMAT = 3
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_CACHES = 64
LEFTOVER_SECONDS = 3600.0
TEMPORARY_PREFIX = ".summaries-"
Stamp = tuple[int, int, int, int]
"""(mtime_ns, size, inode, ctime_ns) of a SKILL.md: an edit whose modification time was put back, or a file renamed
into place with the old one's time and size, still changes its inode or change time."""
Parsed = Mapping[str, tuple[Stamp, SkillSummary]]


class SummaryCache:
    """The summaries of one set of roots, in the JSON file ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, tuple[Stamp, SkillSummary]]:
        data = _read(self.path)
        if data is None:
            return {}
        with contextlib.suppress(OSError):
            os.utime(self.path, follow_symlinks=False)  # used now: the least recently used caches go first
        loaded = {}
        try:
            for file, (*stamp, name, description, warnings) in data["skills"].items():
                kept = tuple(tuple(warning) for warning in warnings)
                if not all(len(warning) == 2 and all(isinstance(part, str) for part in warning) for warning in kept):
                    continue  # not what this cache writes: parsed again instead
                with contextlib.suppress(SkillValidationError):  # parsed again instead
                    summary = validate_summary({"name": name, "description": description}, file)
                    loaded[file] = (tuple(int(part) for part in stamp), replace(summary, warnings=kept))
        except (ValueError, TypeError, KeyError, AttributeError):
            return {}
        return loaded

    def save(self, parsed: Parsed) -> None:
        """Write ``parsed``; a cache that cannot be written only costs the next process its speed."""
        self._write(self.path, {
            "format": FORMAT,
            "skills": {file: [*stamp, s.name, s.description, s.warnings] for file, (stamp, s) in parsed.items()},
        })
        self._prune()

    def _prune(self) -> None:
        """Keep the ``MAX_CACHES`` most recently used caches of the folder (each its summaries and its index)."""
        folder, used, stale = self.path.parent, [], time.time() - LEFTOVER_SECONDS
        try:
            with os.scandir(folder) as listing:
                for entry in listing:
                    with contextlib.suppress(OSError):
                        if entry.name.startswith(TEMPORARY_PREFIX) and entry.stat().st_mtime < stale:
                            os.unlink(entry.path)
                        elif entry.name.endswith(".json") and not entry.name.endswith(".index.json"):
                            used.append((entry.stat().st_mtime_ns, entry.name.removesuffix(".json")))
        except OSError:
            return
        for _, key in sorted(used, reverse=True)[MAX_CACHES:]:
            for name in (f"{key}.json", f"{key}.index.json"):
                with contextlib.suppress(OSError):
                    os.unlink(folder / name)

    def index(self, summaries: list[SkillSummary]) -> SkillIndex:
        """The search index of ``summaries``: read back when the kept one was built from the same summaries, else
        built and kept."""
        path = self.path.with_suffix(".index.json")
        digest = hashlib.sha256("\0".join(f"{s.name}\0{s.description}" for s in summaries).encode()).hexdigest()
        data = _read(path)
        try:
            if data is not None and data.get("digest") == digest:
                return SkillIndex.restore(summaries, data["index"])
        except (ValueError, TypeError, KeyError, AttributeError):
            pass
        index = SkillIndex(summaries)
        self._write(path, {"format": FORMAT, "digest": digest, "index": index.dump()})
        return index

    @staticmethod
    def _write(path: Path, data: dict) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=TEMPORARY_PREFIX)
        except OSError:
            return
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps(data))  # dumps: the C encoder (dump writes piece by piece in Python)
            os.replace(temporary, path)
        except OSError:
            Path(temporary).unlink(missing_ok=True)


def _read(path: Path) -> dict | None:
    """The JSON object of a cache file of this ``FORMAT``; ``None`` for anything else (missing, not a regular file,
    too large, not JSON)."""
    try:
        text = read_regular_file(path, MAX_FILE_BYTES)
        data = json.loads(text) if len(text) <= MAX_FILE_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None
