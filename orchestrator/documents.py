"""The control plane's registries (teams, keys, libraries, egress lists, quotas) in the one record store of both
planes (``worker.run_store``'s documents): in Redis (``skillrun:doc:<kind>``) when the API is shared between
processes, else in files under the data dir; a document whose text cannot be kept (a lone surrogate:
``orchestrator.text``) is refused, naming the field, before it is written."""

from __future__ import annotations

import os

import redis

from orchestrator.config import Settings
from orchestrator.text import check_text
from worker import run_store
from worker.run_store import BaseDocuments

REDIS_PREFIX = "skillrun:doc"


class FileDocuments(run_store.FileDocuments):
    """The registries in files, ``<root>/<kind>/<id>.json``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root, check=check_text)


class RedisDocuments(run_store.RedisDocuments):
    """The registries in the Redis at ``url``."""

    def __init__(self, url: str) -> None:
        super().__init__(redis.Redis.from_url(url), REDIS_PREFIX, check=check_text)


def create_documents(settings: Settings) -> BaseDocuments:
    """Where teams, keys and libraries are kept: Redis when configured, else files under the data dir."""
    if settings.redis_url:
        return RedisDocuments(settings.redis_url)
    return FileDocuments(settings.data_dir / "registry")


__all__ = ["REDIS_PREFIX", "BaseDocuments", "FileDocuments", "RedisDocuments", "create_documents"]
