"""Which store keeps artifacts, from the settings both planes share: ``SKILLRUN_BLOB_URL``, else
``SKILLRUN_ARTIFACTS_DIR``.

* ``file:///var/lib/skillrun/artifacts``: the filesystem store in that folder (the API and every worker share it);
* ``s3://bucket/prefix``: an S3 bucket (``S3ArtifactStore``); ``?endpoint=http://minio:9000`` names another
  S3-protocol server (MinIO, Ceph, moto). Credentials come from boto3's standard chain (``AWS_ACCESS_KEY_ID`` ...),
  never from the URL: one that holds any is refused.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator

if TYPE_CHECKING:
    from worker.artifacts.base import BaseArtifactStore

BUCKET_PATTERN = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
USAGE = "expected file:///path or s3://bucket[/prefix][?endpoint=http(s)://host:port]"


def _parts(url: str) -> urllib.parse.SplitResult:
    """``url`` split, once it names a store in a way this module understands (``ValueError`` saying why not)."""
    parts = urllib.parse.urlsplit(url)
    if "@" in parts.netloc:
        raise ValueError("credentials do not go in the blob URL: give them through boto3's chain "
                         "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, an instance role)")
    if parts.fragment:
        raise ValueError(f"a blob URL has no fragment; {USAGE}")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/") or parts.query:
            raise ValueError(f"{url!r} is not a local folder; {USAGE}")
    elif parts.scheme == "s3":
        if not BUCKET_PATTERN.fullmatch(parts.netloc):
            raise ValueError(f"{parts.netloc!r} is not an S3 bucket name; {USAGE}")
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
        endpoints = query.pop("endpoint", [])
        if query or len(endpoints) > 1 or not all(e.startswith(("http://", "https://")) for e in endpoints):
            raise ValueError(f"the only query an s3 blob URL takes is one endpoint=http(s)://...; {USAGE}")
        if any("@" in urllib.parse.urlsplit(e).netloc for e in endpoints):
            raise ValueError("credentials do not go in the endpoint either: give them through boto3's chain "
                             "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, an instance role)")
    else:
        raise ValueError(f"unknown blob store {parts.scheme!r}; {USAGE}")
    return parts


def check_blob_url(url: str) -> str:
    _parts(url)
    return url


BlobUrl = Annotated[str, AfterValidator(check_blob_url)]
"""A settings field holding a blob URL, refused with the reason when malformed."""


def create_artifact_store(blob_url: str | None, artifacts_dir: Path | None) -> BaseArtifactStore | None:
    """The store the settings name (``blob_url`` first); ``None`` when they name none (a runtime then keeps its own
    folder under its work root)."""
    from worker.artifacts.files import FileArtifactStore  # here: the settings that name a store load none

    if blob_url is None:
        return FileArtifactStore(artifacts_dir) if artifacts_dir is not None else None
    parts = _parts(blob_url)
    if parts.scheme == "file":
        return FileArtifactStore(urllib.parse.unquote(parts.path))
    from worker.artifacts.s3 import S3ArtifactStore  # boto3 (~0.2 s to import) loads only where S3 is used

    endpoint = urllib.parse.parse_qs(parts.query).get("endpoint", [None])[0]
    return S3ArtifactStore(parts.netloc, urllib.parse.unquote(parts.path), endpoint_url=endpoint)
