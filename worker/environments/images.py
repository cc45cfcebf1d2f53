"""Derived Docker images (the sandbox image plus a skill's Debian packages) as the environment store knows them,
without an engine: their content tags, and where one stands.

``worker.runtimes.docker.images`` builds them with the engine; what it leaves in the store — the last use
(``images/<digest>.used``, written when the image is built, removed with it), a failure record
(``locks/image-<digest>.failed``) and the lock a build holds (``image-<digest>``) — is what ``image_status`` reads,
so the API, which has no engine, says what the Docker runtime's workers would find.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from worker.environments.store import EnvironmentStore

REPOSITORY = "skillrun/sandbox-debian"
"""Derived images are tagged ``REPOSITORY:<digest>``."""
ROOTFS_TAG = "rootfs:"
"""The local runtime's root filesystems are tagged ``rootfs:<digest>``."""


@dataclass(frozen=True)
class ImageStatus:
    """Where the derived image a skill's Debian packages need stands (on the local runtime: whether the host has
    them, ``tag`` then names the host)."""

    tag: str
    state: str
    """``ready``, ``building``, ``not built`` or ``failed``."""
    packages: tuple[str, ...] = ()
    message: str = ""
    summary: str = ""
    """What a skill's state says when this part is behind, in place of the derived image's sentence."""
    on_host: bool = False
    """The local runtime's part: whether the host itself has the packages (``worker.environments.host_packages``)."""

    @property
    def root_filesystem(self) -> bool:
        """Whether this is the local runtime's root filesystem with the packages (``worker.environments.systems``),
        tagged ``rootfs:<digest>``."""
        return self.tag.startswith(ROOTFS_TAG)

    def as_json(self) -> dict:
        return {"tag": self.tag, "state": self.state, "packages": list(self.packages), "message": self.message}


def bundle_digest(ca_bundle: str | None) -> str:
    """The sha256 of the CA bundle derived images trust (part of their tag); empty without one."""
    if not ca_bundle:
        return ""
    try:
        return hashlib.sha256(Path(ca_bundle).read_bytes()).hexdigest()
    except OSError:
        return ""


def image_tag(base_id: str, packages: tuple[str, ...], ca_digest: str) -> str:
    """The content tag of ``packages`` on the base image ``base_id``, trusting the CA bundle of ``ca_digest``."""
    content = json.dumps({"base": base_id, "packages": sorted(set(packages)), "ca_bundle": ca_digest})
    return f"{REPOSITORY}:{hashlib.sha256(content.encode()).hexdigest()}"


def digest_of(tag: str) -> str:
    return tag.rsplit(":", 1)[1]


def image_lock(tag: str) -> str:
    """The name of the lock a build of ``tag`` holds, and of its failure record."""
    return f"image-{digest_of(tag)}"


def used_record(store: EnvironmentStore, tag: str) -> Path:
    return store.images / f"{digest_of(tag)}.used"


def image_status(store: EnvironmentStore, tag: str, packages: tuple[str, ...], *, exists: bool | None = None) -> ImageStatus:
    """Where the image ``tag`` stands: ``exists`` is what the engine says, or ``None`` without an engine (the
    store's record of its build then says; an image removed behind Skillrun's back is built again by a run)."""
    if exists if exists is not None else used_record(store, tag).is_file():
        return ImageStatus(tag, "ready", packages)
    if store.busy(image_lock(tag)):
        return ImageStatus(tag, "building", packages, f"installing the Debian packages {', '.join(packages)}")
    failure = store.failure(image_lock(tag))
    if failure is not None:
        return ImageStatus(tag, "failed", packages, failure[0])
    return ImageStatus(tag, "not built", packages)


__all__ = ["REPOSITORY", "ROOTFS_TAG", "ImageStatus", "bundle_digest", "image_lock", "image_status", "image_tag", "used_record"]
