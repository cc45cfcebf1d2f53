"""A small document store for the control plane's registries (teams, keys, libraries).

JSON documents by kind and id, in Redis (a hash per kind) when the API is shared between processes, or in JSON
files (one per document, replaced atomically) for the embedded default. A document whose text cannot be kept (a lone
surrogate: ``orchestrator.text``) is refused before it is written.
"""

from __future__ import annotations

import json
import os
import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import redis

from orchestrator.text import check_text

_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class BaseDocuments(ABC):
    @abstractmethod
    def get(self, kind: str, doc_id: str) -> dict[str, Any] | None: ...

    @abstractmethod
    def put(self, kind: str, doc_id: str, doc: dict[str, Any]) -> None: ...

    @abstractmethod
    def all(self, kind: str) -> list[dict[str, Any]]: ...

    def close(self) -> None:
        """Release connections."""


def _check(doc_id: str) -> str:
    if not _ID.match(doc_id) or doc_id in {".", ".."}:
        raise ValueError(f"invalid document id {doc_id!r}")
    return doc_id


def _encoded(kind: str, doc: dict[str, Any]) -> str:
    """``doc`` as stored (``UnencodableTextError`` for text no store can keep, which JSON's ASCII escapes would
    otherwise write, to fail every read after)."""
    check_text(doc, kind)
    return json.dumps(doc)


class FileDocuments(BaseDocuments):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def get(self, kind: str, doc_id: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.root / kind / f"{_check(doc_id)}.json").read_text())
        except FileNotFoundError:
            return None

    def put(self, kind: str, doc_id: str, doc: dict[str, Any]) -> None:
        encoded = _encoded(kind, doc)
        folder = self.root / kind
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = folder / f".{_check(doc_id)}.{os.getpid()}.tmp"
        tmp.write_text(encoded)
        os.replace(tmp, folder / f"{doc_id}.json")

    def all(self, kind: str) -> list[dict[str, Any]]:
        folder = self.root / kind
        return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


class RedisDocuments(BaseDocuments):
    def __init__(self, url: str, prefix: str = "skillrun:doc") -> None:
        self.redis = redis.Redis.from_url(url)
        self.prefix = prefix

    def get(self, kind: str, doc_id: str) -> dict[str, Any] | None:
        raw = self.redis.hget(f"{self.prefix}:{kind}", _check(doc_id))
        return json.loads(raw) if raw else None

    def put(self, kind: str, doc_id: str, doc: dict[str, Any]) -> None:
        self.redis.hset(f"{self.prefix}:{kind}", _check(doc_id), _encoded(kind, doc))

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [json.loads(v) for _, v in sorted(self.redis.hgetall(f"{self.prefix}:{kind}").items())]

    def close(self) -> None:
        self.redis.close()
