"""The artifact stores under test: the filesystem store, and the S3 store against moto's S3 emulator.

``S3Server`` is moto's threaded server in this process on a free loopback port (a real S3-protocol server over HTTP;
in-process, so a test can make stored objects look old, as the filesystem tests set mtimes). Without ``moto[server]``
(the test extra) the tests that need it fail under CI and are skipped elsewhere (``tests.services.unavailable``).
"""

from __future__ import annotations

import datetime
import itertools
import logging
import os
import time
from typing import TYPE_CHECKING

from tests.services import free_port, unavailable
from worker.artifacts import BaseArtifactStore, FileArtifactStore, create_artifact_store
from worker.artifacts.base import name_key

if TYPE_CHECKING:
    from worker.artifacts import S3ArtifactStore

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
"""What boto3's chain finds in the tests (and in the worker processes they start): moto takes any credentials."""
_buckets = itertools.count(1)


class S3Server:
    """moto's S3 emulator on a free loopback port; ``stop`` and ``start`` again keep what it stores."""

    def __init__(self) -> None:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError:
            unavailable("moto[server] is not installed: bash .ci/setup --test installs it")
        self._server_class = ThreadedMotoServer
        self.port = free_port()
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._server = self._server_class(ip_address="127.0.0.1", port=self.port, verbose=False)
        try:
            self._server.start()
        except OSError as exc:
            unavailable(f"moto's S3 server did not start on port {self.port}: {exc}")

    def stop(self) -> None:
        """Stop serving and close the port: connections are refused (not left waiting)."""
        self._server.stop()
        self._server._server.server_close()

    def blob_url(self) -> str:
        """The ``SKILLRUN_BLOB_URL`` of a new, empty bucket (under the prefix ``artifacts``)."""
        bucket = f"test-{os.getpid()}-{next(_buckets)}"
        url = f"s3://{bucket}/artifacts?endpoint={self.endpoint}"
        create_artifact_store(url, None).client.create_bucket(Bucket=bucket)
        return url

    def store(self) -> S3ArtifactStore:
        """A store in a new, empty bucket, as the settings would make it."""
        return create_artifact_store(self.blob_url(), None)

    @staticmethod
    def empty(store: S3ArtifactStore) -> None:
        """Remove the store's bucket and what it holds (moto keeps it all in this process's memory)."""
        _buckets_held().pop(store.bucket, None)


def age(store: BaseArtifactStore, scope: str, name: str, version: int, seconds: float) -> None:
    """Make a stored version (and, in a folder, the folders above it) look ``seconds`` old."""
    if isinstance(store, FileArtifactStore):
        then = time.time() - seconds
        folder = store.root / name_key(scope, name)
        for path in (folder / str(version) / "meta.json", folder, folder.parent):
            os.utime(path, (then, then))
        return
    keys = _buckets_held()[store.bucket].keys
    then = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - datetime.timedelta(seconds=seconds)
    prefix = f"{store.prefix}{name_key(scope, name)}/{version}/"
    for key in [k for k in keys if k.startswith(prefix)]:
        keys[key].last_modified = then


def leftovers(store: BaseArtifactStore, scope: str, name: str) -> list[str]:
    """Whatever the store holds for ``name`` in ``scope``, complete or not: files and folders, or objects and
    unfinished multipart uploads."""
    if isinstance(store, FileArtifactStore):
        folder = store.root / name_key(scope, name)
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.is_dir() else []
    prefix = f"{store.prefix}{name_key(scope, name)}/"
    objects = store.client.list_objects_v2(Bucket=store.bucket, Prefix=prefix).get("Contents", [])
    uploads = store.client.list_multipart_uploads(Bucket=store.bucket, Prefix=prefix).get("Uploads", [])
    return sorted([o["Key"][len(prefix):] for o in objects] + [f"upload of {u['Key'][len(prefix):]}" for u in uploads])


def _buckets_held() -> dict:
    """The emulator's buckets, by name."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    return s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets
