"""Library versions on a worker that does not share the API's libraries folder: fetched from the API by sha256.

A run's skill from a team library names the version's folder on the API's host and the sha256 of the archive it was
extracted from (``SkillRef.digest``). A worker that sees that folder (one host, or a shared volume) uses it. One that
does not fetches the archive from the API (``GET <SKILLRUN_API_URL>/v1/worker/libraries/<sha256>``, showing
``SKILLRUN_WORKER_TOKEN``), checks its digest before extracting anything, and keeps it in its URL-root cache like any
URL root (``worker.roots.sources``: safe extraction, ``.ready`` and an atomic rename, the cache's bound, held while a run
uses it). The token goes to the API's origin only, never to a redirect elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from worker.roots.archives import FetchLimits
from worker.contract import SkillRef
from worker.errors import SkillRootError
from worker.roots.cache import DIGEST
from worker.roots.sources import is_url, resolve_root, root_in_use

LIBRARY_ROUTE = "/v1/worker/libraries/{}"


@dataclass(frozen=True)
class Located:
    """Where this worker reads a skill's root from: a folder or URL, and what a download of it must send."""

    root: str
    expected_sha256: str | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # the worker token: never in a repr
    limits: FetchLimits | None = None

    @property
    def remote(self) -> bool:
        """Whether the root is fetched (an http(s) URL) into the cache, where a run must hold it."""
        return urllib.parse.urlsplit(self.root).scheme in ("http", "https")

    def resolve(self) -> Path:
        """The local folder (``worker.roots.sources.resolve_root``)."""
        return resolve_root(self.root, expected_sha256=self.expected_sha256, limits=self.limits, headers=self.headers)


def locate(skill: SkillRef) -> Located:
    """``skill``'s root as this worker reaches it: a URL root or a folder that is here as named, else the API's
    archive of the library version (its folder is on another host)."""
    if is_url(skill.root) or skill.digest is None or os.path.isdir(skill.root):
        return Located(skill.root, skill.digest)
    if not DIGEST.fullmatch(skill.digest):
        raise SkillRootError(f"skill {skill.name!r}: {skill.digest[:80]!r} is not a sha256 (64 hexadecimal digits)")
    from worker.config import get_worker_settings  # here: resolving local folders never reads the worker's settings

    settings = get_worker_settings()
    if settings.api_url is None or settings.worker_token is None:
        raise SkillRootError(
            f"library version {skill.digest[:12]} is not on this worker ({skill.root} does not exist here) and the "
            "worker cannot fetch it: set SKILLRUN_API_URL and SKILLRUN_WORKER_TOKEN (the API's) on the worker"
        )
    url = settings.api_url.rstrip("/") + LIBRARY_ROUTE.format(skill.digest)
    return Located(url, skill.digest, {"Authorization": f"Bearer {settings.worker_token.get_secret_value()}"},
                   FetchLimits(download_seconds=settings.library_fetch_seconds))


@contextlib.contextmanager
def skill_root_in_use(skill: SkillRef) -> Iterator[Path]:
    """The local folder of ``skill``'s root, fetched when needed and kept from the cache's eviction until the block
    ends (``worker.roots.sources.root_in_use``)."""
    located = locate(skill)
    with root_in_use(located.root, expected_sha256=located.expected_sha256, limits=located.limits,
                     headers=located.headers) as folder:
        yield folder
