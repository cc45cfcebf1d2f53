"""Skill roots and libraries: where a run's skills come from (a folder, a ``file://`` URL or an archive URL), the
URL-root cache, downloads, safe archive extraction, library fetch, and the folder helpers stores share."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.roots.sources": ["download_archive", "install_archive", "is_url", "resolve_root", "root_in_use",
                             "split_pin"],
    "worker.roots.archives": ["ArchiveLimits", "FetchLimits", "extract_tar", "extract_zip"],
    "worker.roots.library_fetch": ["locate", "skill_root_in_use"],
    "worker.roots.folders": ["remove_tree"],
    "worker.roots.cache": ["DIGEST", "cached_sha256"],
})
