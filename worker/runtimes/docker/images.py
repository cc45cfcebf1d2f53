"""Derived sandbox images: the sandbox image plus a skill's Debian packages, built once per set, tagged by content.

A skill that declares Debian packages (``debian = [...]`` in its library's ``skillrun.toml``) runs in containers of
an image made from the sandbox image with ``apt-get install`` of exactly those packages. Its tag is the sha256 of
the base image's id, the sorted packages and the CA bundle it trusts, so a set is built once on a base and reused
by every skill and workspace that declares it, and a sandbox image built anew gets derived images of its own.

An image is built by the local engine (never pulled) the way ``images/build.sh`` builds the base: a container of
the base image runs ``apt-get update`` and ``apt-get install --no-install-recommends`` as root (apt needs it; the
packages come only from the signed Debian archive, the skill names them and nothing more), the configured CA
bundle (``SKILLRUN_ENV_CA_BUNDLE``, for networks that intercept TLS) mounted read-only and added to the image's
trusted certificates as ``images/base/build-base.sh`` does, on the default bridge network, with no proxy settings
of the Docker client, under the environment builds' timeout and memory limit; the container is then committed as
the image (one layer on the base, the base's user and command restored) and removed. One build per tag at a time
across workers (a lock in the environment store). A package apt cannot find fails the build with apt's own
message, recorded in the store (``locks/image-<digest>.failed``): runs in the next ``RETRY_SECONDS`` get it at once
instead of building again, ``status`` reports it, and ``prepare`` (``image_for(again=True)``) tries again.

Last use is the mtime of ``<environment store>/images/<digest>.used``, touched when the image is built and whenever
a workspace container of it starts or is removed; an image with a container is in use now. ``skillrun envs list``
shows every derived image on the engine; ``skillrun envs prune`` removes those this store has a record of and no
container uses (workers that share an engine share a store, so an image is never pruned for another's lack of a
record).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import docker
import docker.errors
from docker.types import Mount

from worker.environments import BuildSettings, EnvironmentStore
from worker.environments.images import (
    REPOSITORY,
    ImageStatus,
    bundle_digest,
    image_lock,
    image_status,
    image_tag,
    used_record,
)
from worker.environments.manager import RETRY_SECONDS
from worker.environments.steps import BUILD_PROCESSES
from worker.errors import EnvironmentBuildError, EnvironmentNotReadyError
from worker.runtimes.docker.builds import CA_BUNDLE_PATH, TIMEOUT_SLACK_SECONDS
from worker.runtimes.docker.host import RESIDENT_UID
from worker.runtimes.docker.engine import ENGINE_ERRORS, engine_time, map_docker_errors

PACKAGES_LABEL = "skillrun.debian.packages"
BASE_LABEL = "skillrun.debian.base"
POLL_SECONDS = 0.2
SEEN_SECONDS = 30.0
"""How long an image the engine showed is taken to be there without asking again (only an operator's prune removes
one, and only one no container uses)."""
MESSAGE_LINES = 30
"""How much of apt's output a failed build's error quotes (its end, where apt says what failed)."""
INSTALL = """set -e
export DEBIAN_FRONTEND=noninteractive
if [ -f {bundle} ]; then
  cp {bundle} /usr/local/share/ca-certificates/extra-ca-bundle.crt
  cat {bundle} >> /etc/ssl/certs/ca-certificates.crt
fi
apt-get -q update
apt-get -q install -y --no-install-recommends -- "$@"
apt-get clean
rm -rf /var/lib/apt/lists/*
""".format(bundle=CA_BUNDLE_PATH)
"""What the build container runs (as ``bash -c INSTALL bash <packages>``: the names are arguments, never code; under
a coreutils ``timeout`` that stops it should the worker die first; its name marks it as a build container, which
the next worker's build runner removes then; no label, which the committed image would keep)."""


@dataclass(frozen=True)
class DerivedImage:
    """One derived image, as ``skillrun envs list`` shows it."""

    tag: str
    id: str
    packages: list[str]
    base: str
    size_bytes: int
    created: float
    last_used: float | None
    """When a container of it last started or went, or now while it has one; ``None``: no record in this store."""
    containers: int
    """Containers of it that exist now (running or not): while there is one, it is in use."""

    def as_json(self) -> dict:
        return {"tag": self.tag, "id": self.id, "packages": self.packages, "base": self.base,
                "size_bytes": self.size_bytes, "created": self.created, "last_used": self.last_used,
                "containers": self.containers}


class DerivedImages:
    """Derived images on the local engine, and their last use in ``store`` (see the module's description)."""

    def __init__(self, client: Callable[[], docker.DockerClient], store: EnvironmentStore, settings: BuildSettings):
        self.client = client
        self.store = store
        self.settings = settings
        self.uses = store.images
        self._seen: dict[str, float] = {}  # tag → when the engine last showed it (monotonic)

    @functools.cached_property
    def _bundle_digest(self) -> str:
        """The sha256 of the CA bundle images trust, read once (a new bundle takes a worker restart)."""
        return bundle_digest(self.settings.ca_bundle)

    def tag(self, base_id: str, packages: tuple[str, ...]) -> str:
        """The content tag of ``packages`` on the base image ``base_id``."""
        return image_tag(base_id, packages, self._bundle_digest)

    def status(self, base_id: str, packages: tuple[str, ...]) -> ImageStatus:
        """Where the image with ``packages`` on ``base_id`` stands (asks the engine; no build)."""
        tag = self.tag(base_id, packages)
        return image_status(self.store, tag, packages, exists=self._exists(tag))

    async def image_for(self, base_id: str, packages: tuple[str, ...], *, skill: str, wait: bool,
                        again: bool = False) -> str:
        """The tag of the image with ``packages`` on ``base_id``: built before, or built now when ``wait``
        (otherwise ``EnvironmentNotReadyError``); ``EnvironmentBuildError`` with apt's message when it fails, also
        at once for ``RETRY_SECONDS`` after a failure unless ``again`` (a preparation always tries)."""
        tag = await asyncio.to_thread(self.tag, base_id, packages)
        seen = self._seen.get(tag)
        if (seen is not None and time.monotonic() - seen < SEEN_SECONDS) or await asyncio.to_thread(self._exists, tag):
            return tag
        failure = None if again else self.store.failure(image_lock(tag))
        if failure is not None and time.time() - failure[1] < RETRY_SECONDS:
            raise EnvironmentBuildError(
                f"{failure[0]}\n(this build failed {time.time() - failure[1]:.0f} s ago; runs try it again after "
                f"{RETRY_SECONDS:g} s; `skillrun skills prepare --runtime docker` tries at once)"
            )
        if not wait:
            building = self.store.busy(image_lock(tag))
            raise EnvironmentNotReadyError(
                f"skill {skill!r}: the sandbox image with its Debian packages ({', '.join(packages)}) is "
                f"{'being built' if building else 'not built yet'}; build it with `skillrun skills prepare "
                "--runtime docker`, or submit the run with wait_for_environment=true to build it first"
            )
        async with self.store.exclusive(image_lock(tag)):
            if not await asyncio.to_thread(self._exists, tag):
                try:
                    await self._build(tag, base_id, sorted(set(packages)))
                except EnvironmentBuildError as exc:
                    message = f"skill {skill!r}: {exc}"
                    await asyncio.to_thread(self.store.record_failure, image_lock(tag), message)
                    raise EnvironmentBuildError(message) from exc
        await asyncio.to_thread(self.store.clear_failure, image_lock(tag))
        return tag

    def _exists(self, tag: str) -> bool:
        """Whether the engine has ``tag`` (remembered for ``SEEN_SECONDS``)."""
        with map_docker_errors(f"looking up the image {tag}"):
            try:
                self.client().images.get(tag)
            except docker.errors.ImageNotFound:
                return False
        self._seen[tag] = time.monotonic()
        return True

    async def _build(self, tag: str, base_id: str, packages: list[str]) -> None:
        """Install ``packages`` in a container of ``base_id`` and commit it as ``tag`` (the container goes either
        way); stopped at the build timeout."""
        started = time.monotonic()
        container = await asyncio.to_thread(self._start, base_id, packages)
        try:
            while True:
                with map_docker_errors("following a Debian package build"):
                    state = (await asyncio.to_thread(self.client().api.inspect_container, container))["State"]
                if not state["Running"]:
                    break
                if time.monotonic() - started > self.settings.timeout:
                    raise EnvironmentBuildError(
                        f"installing the Debian packages {', '.join(packages)} did not finish within "
                        f"{self.settings.timeout:g} s (SKILLRUN_ENV_BUILD_TIMEOUT); it was stopped"
                    )
                await asyncio.sleep(POLL_SECONDS)
            if state["ExitCode"] != 0:
                output = await asyncio.to_thread(self._output, container)
                memory = " (it ran out of memory)" if state.get("OOMKilled") else ""
                raise EnvironmentBuildError(
                    f"installing the Debian packages {', '.join(packages)} failed (apt exited with "
                    f"{state['ExitCode']}){memory}:\n{output}"
                )
            await asyncio.to_thread(self._commit, container, tag, base_id, packages)
        finally:
            await asyncio.to_thread(self._remove_container, container)

    def _start(self, base_id: str, packages: list[str]) -> str:
        # A mount, not a volume: the SDK lists a volume's path in the container's config, which the commit would
        # keep, and every container of the image would then get an anonymous volume there (over the file: refused).
        mounts = []
        if self.settings.ca_bundle and os.path.isfile(self.settings.ca_bundle):
            mounts.append(Mount(CA_BUNDLE_PATH, self.settings.ca_bundle, type="bind", read_only=True))
        backstop = ["timeout", "-s", "KILL", str(int(self.settings.timeout) + TIMEOUT_SLACK_SECONDS)]
        with map_docker_errors("starting a Debian package build"):
            return self.client().containers.run(
                base_id, [*backstop, "bash", "-c", INSTALL, "bash", *packages],
                name=f"skillrun-debian-{secrets.token_hex(6)}", detach=True, user="0:0", network_mode="bridge",
                security_opt=["no-new-privileges"], mem_limit=self.settings.memory_bytes,
                memswap_limit=self.settings.memory_bytes, pids_limit=BUILD_PROCESSES, mounts=mounts,
                use_config_proxy=False,
            ).id

    def _output(self, container: str) -> str:
        with contextlib.suppress(*ENGINE_ERRORS):
            text = self.client().api.logs(container, stdout=True, stderr=True).decode("utf-8", errors="replace")
            return "\n".join(text.strip().splitlines()[-MESSAGE_LINES:])
        return ""

    def _commit(self, container: str, tag: str, base_id: str, packages: list[str]) -> None:
        repository, version = tag.rsplit(":", 1)
        changes = [f"USER {RESIDENT_UID}:{RESIDENT_UID}", "WORKDIR /", 'CMD ["sleep", "infinity"]',
                   f"LABEL {PACKAGES_LABEL}={','.join(packages)} {BASE_LABEL}={base_id}"]
        with map_docker_errors(f"saving the image {tag}"):
            self.client().api.commit(container, repository=repository, tag=version, changes=changes)
        self._seen[tag] = time.monotonic()
        self.mark_used(tag)

    def _remove_container(self, container: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            with map_docker_errors("removing a Debian package build container"):
                self.client().api.remove_container(container, force=True)

    def mark_used(self, tag: str) -> None:
        """Record that a container of ``tag`` started or went now (nothing for an image that is not derived)."""
        if not tag.startswith(f"{REPOSITORY}:"):
            return
        self.store.ensure()
        self.uses.mkdir(mode=0o700, exist_ok=True)
        with contextlib.suppress(OSError):
            used_record(self.store, tag).touch()

    def list(self) -> list[DerivedImage]:
        """Every derived image on the engine, the most recently used first."""
        client = self.client()
        found = []
        with map_docker_errors("listing derived images"):
            for image in client.images.list(filters={"label": PACKAGES_LABEL}):
                tags = [t for t in image.tags if t.startswith(f"{REPOSITORY}:")]
                if not tags:
                    continue
                labels = image.labels or {}
                containers = client.api.containers(all=True, quiet=True, filters={"ancestor": image.id})
                last_used = None
                with contextlib.suppress(OSError):
                    last_used = used_record(self.store, tags[0]).stat().st_mtime
                found.append(DerivedImage(
                    tag=tags[0], id=image.id, packages=labels.get(PACKAGES_LABEL, "").split(","),
                    base=labels.get(BASE_LABEL, ""), size_bytes=image.attrs.get("Size", 0),
                    created=engine_time(image.attrs.get("Created", "")),
                    last_used=time.time() if containers else last_used, containers=len(containers),
                ))
        return sorted(found, key=lambda image: image.last_used or 0.0, reverse=True)

    def remove(self, image: DerivedImage) -> None:
        """Remove a derived image no container uses (the engine refuses one that is in use), and its records in
        the store: last use, failure, lock file."""
        with map_docker_errors(f"removing the image {image.tag}"):
            self.client().images.remove(image.tag)
        self._seen.pop(image.tag, None)
        used_record(self.store, image.tag).unlink(missing_ok=True)
        self.store.clear_failure(image_lock(image.tag))
        self.store.remove_lock_file(image_lock(image.tag))


__all__ = ["REPOSITORY", "DerivedImage", "DerivedImages"]
