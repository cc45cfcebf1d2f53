"""An S3-compatible artifact store (AWS S3, MinIO, any S3-protocol server), through boto3.

The keys are the filesystem store's paths under the prefix, plus an empty ``<version>/claim``. A save takes the
next version by writing its claim with ``If-None-Match: *`` (a conditional write: a second writer of the same key
gets 412, or 409 while the first is under way, and tries the next number), streams the data up with boto3's managed
transfer (one PUT below ``PART_BYTES``, past it a multipart upload holding at most ``PARTS_IN_MEMORY`` parts in
memory), then writes ``meta.json``. A failed save deletes what it wrote (the transfer aborts its own multipart
upload); when the store cannot be reached even for that, what stays has no ``meta.json``: it is never listed or
served, and ``prune`` removes it once it is past the retention and ``ABANDONED_SECONDS`` old. The server must honour
conditional writes (AWS S3, MinIO, Ceph RGW, Cloudflare R2 and moto do).

Credentials, region and the like come from boto3's standard chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
a profile, an instance or pod role). botocore's errors become ``BlobStoreError`` here (``_errors``), an object that
is not there an ``ArtifactError``.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from worker.artifacts.base import (
    DATA,
    DEFAULT_MAX_ARTIFACT_BYTES,
    META,
    PRUNE_BATCH,
    ArtifactStream,
    BaseArtifactStore,
    Body,
    MeteredReader,
    name_key,
)
from worker.contract import WORKSPACE_ID_PATTERN, ArtifactFile
from worker.errors import ArtifactError, BlobStoreError

CLAIM = "claim"
PART_BYTES = 8 * 1024 * 1024
"""Size of one part of a multipart upload, and the size from which uploads are multipart."""
PARTS_IN_MEMORY = 4
"""Parts of one upload read ahead at most (each ``PART_BYTES``): what an upload holds in memory."""
UPLOAD_THREADS = 4
ABANDONED_SECONDS = 24 * 3600
"""A version without ``meta.json`` this old is an abandoned save (its writer died or lost the store)."""
DELETE_BATCH = 1000
"""Keys one DeleteObjects request takes at most (S3's limit)."""
_TAKEN = {"PreconditionFailed", "ConditionalRequestConflict"}
"""What a conditional write of an existing (412) or concurrently written (409) key answers."""


class S3ArtifactStore(BaseArtifactStore):
    """Stores artifacts in ``bucket`` under ``prefix``; ``endpoint_url`` for a server other than AWS S3 (path-style
    addressing, as MinIO and moto serve it)."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 max_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES) -> None:
        super().__init__(max_bytes)
        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}"
        config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=60,
                        s3={"addressing_style": "path"} if endpoint_url else None)
        self.client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
        self._transfer = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES,
                                        max_concurrency=UPLOAD_THREADS, preferred_transfer_client="classic")
        self._transfer.max_in_memory_upload_chunks = PARTS_IN_MEMORY

    def _save(self, scope: str, name: str, reader: MeteredReader, mime_type: str) -> ArtifactFile:
        base = self.prefix + name_key(scope, name)
        with self._errors(f"store artifact {name!r}"):
            version = self._claim(base)
            keys = [f"{base}/{version}/{leaf}" for leaf in (CLAIM, DATA, META)]
            try:
                self.client.upload_fileobj(reader, self.bucket, keys[1], ExtraArgs={"ContentType": mime_type},
                                           Config=self._transfer)
                artifact = reader.artifact(version, mime_type)
                self.client.put_object(Bucket=self.bucket, Key=keys[2], Body=artifact.model_dump_json().encode(),
                                       ContentType="application/json")
            except BaseException:
                with contextlib.suppress(BotoCoreError, ClientError):  # unreachable: prune finds it abandoned
                    self._delete(keys)  # meta.json too: its write may have landed with no answer
                raise
        return artifact

    def _claim(self, base: str) -> int:
        """The next free version of the name at ``base``, taken with a conditional write of its claim."""
        version = max((v for v, _ in self._entries(base)), default=0) + 1
        while True:
            try:
                self.client.put_object(Bucket=self.bucket, Key=f"{base}/{version}/{CLAIM}", Body=b"", IfNoneMatch="*")
                return version
            except ClientError as exc:
                if _code(exc) not in _TAKEN:
                    raise
            version += 1

    def versions(self, scope: str, name: str) -> list[int]:
        with self._errors(f"list the versions of {name!r}"):
            return sorted(v for v, leaf in self._entries(self.prefix + name_key(scope, name)) if leaf == META)

    def _names(self, scope: str) -> list[str]:
        prefix = f"{self.prefix}{scope}/"
        with self._errors(f"list the artifacts of {scope!r}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix,
                                                                          Delimiter="/")
            return [urllib.parse.unquote(common["Prefix"][len(prefix):-1])
                    for page in pages for common in page.get("CommonPrefixes", [])]

    def info(self, scope: str, name: str, version: int | None = None) -> ArtifactFile:
        chosen = self._chosen_version(scope, name, version)
        with self._errors(f"read artifact {name!r}"):
            meta = self._get(f"{self.prefix}{name_key(scope, name)}/{chosen}/{META}", name, chosen)["Body"].read()
        return ArtifactFile.model_validate_json(meta)

    def open(self, scope: str, name: str, version: int | None = None) -> ArtifactStream:
        chosen = self._chosen_version(scope, name, version)
        what = f"read artifact {name!r}"
        with self._errors(what):
            response = self._get(f"{self.prefix}{name_key(scope, name)}/{chosen}/{DATA}", name, chosen)
        return ArtifactStream(response["ContentLength"], _Body(response["Body"], self._errors, what))

    def prune(self, stored_before: float, limit: int = PRUNE_BATCH) -> int:
        """Remove up to ``limit`` versions whose ``meta.json`` was stored before the time ``stored_before`` (and
        abandoned saves, ``ABANDONED_SECONDS`` old); return how many went. It reads the whole store's listing."""
        abandoned_before = min(stored_before, time.time() - ABANDONED_SECONDS)
        doomed: list[str] = []
        removed = 0
        with self._errors("prune artifacts"):
            for folder, group in itertools.groupby(self._objects(self.prefix), lambda o: o["Key"].rpartition("/")[0]):
                if not _is_version_folder(folder[len(self.prefix):]):
                    continue
                objects = list(group)
                meta = next((o for o in objects if o["Key"].endswith(f"/{META}")), None)
                if meta is not None:
                    stored, cutoff = meta["LastModified"].timestamp(), stored_before
                else:
                    stored, cutoff = max(o["LastModified"].timestamp() for o in objects), abandoned_before
                if stored < cutoff:
                    if removed >= limit:
                        break
                    doomed += [o["Key"] for o in objects]
                    removed += 1
            for start in range(0, len(doomed), DELETE_BATCH):
                self._delete(doomed[start:start + DELETE_BATCH])
        return removed

    def _objects(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Every object under ``prefix``, in key order."""
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            yield from page.get("Contents", [])

    def _entries(self, base: str) -> Iterator[tuple[int, str]]:
        """(version, leaf) of every object of the name at ``base``."""
        for obj in self._objects(f"{base}/"):
            version, _, leaf = obj["Key"][len(base) + 1:].partition("/")
            if version.isdigit():
                yield int(version), leaf

    def _get(self, key: str, name: str, version: int) -> dict[str, Any]:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _code(exc) == "NoSuchKey":  # pruned since it was listed
                raise ArtifactError(f"artifact {name!r} version {version} is gone") from exc
            raise

    def _delete(self, keys: list[str]) -> None:
        self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """botocore's errors as ours: what the store answered, or why it could not be asked."""
        try:
            yield
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise BlobStoreError(f"the blob store {self.url} refused to {what}: {error.get('Code')}: "
                                 f"{error.get('Message')}") from exc
        except BotoCoreError as exc:
            raise BlobStoreError(f"the blob store {self.url} could not {what}: {exc}") from exc


class _Body:
    """An object's body whose read errors are ours."""

    def __init__(self, body: Body, errors: Callable[[str], AbstractContextManager[None]], what: str) -> None:
        self._body = body
        self._errors = errors
        self._what = what

    def read(self, size: int) -> bytes:
        with self._errors(self._what):
            return self._body.read(size)

    def close(self) -> None:
        self._body.close()


def _code(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


def _is_version_folder(relative: str) -> bool:
    """Whether ``<scope>/<quoted name>/<version>`` (not some other object under the prefix)."""
    parts = relative.split("/")
    return len(parts) == 3 and bool(WORKSPACE_ID_PATTERN.fullmatch(parts[0])) and parts[2].isdigit()
