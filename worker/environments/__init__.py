"""Skill dependencies: declarations, locks and content-addressed environments built once with ``uv`` or ``npm``.

``declarations`` reads what a skill needs, ``builder`` resolves and builds it as untrusted code, ``store`` keeps
the results, ``systems`` builds the local runtime's root filesystems for Debian packages, ``manager`` answers
runtimes, the CLI and the API. ``local_environments`` makes the local runtime's.
"""

from __future__ import annotations

from pathlib import Path

from worker.config import get_worker_settings
from worker.environments.builder import BuildSettings, EnvironmentBuilder
from worker.environments.declarations import MANIFEST_FILE, Declaration, Manifest, read_declaration, read_manifest
from worker.environments.images import bundle_digest, image_status, image_tag
from worker.environments.manager import NO_ENVIRONMENT, DeclarationCache, EnvironmentStatus, NodeStatus, RunEnvironment, SkillEnvironments
from worker.environments.store import EnvironmentInfo, EnvironmentStore
from worker.environments.target import Target, local_target


def build_settings(*, sandboxed: bool) -> BuildSettings:
    """How builds run, from the worker settings (``SKILLRUN_ENV_*``)."""
    settings = get_worker_settings()
    return BuildSettings(
        index_url=settings.env_index_url, ca_bundle=settings.env_ca_bundle, timeout=settings.env_build_timeout_seconds,
        max_bytes=settings.env_max_bytes, memory_bytes=settings.env_build_memory_bytes, sandboxed=sandboxed,
        npm_registry=settings.env_npm_registry, debian_suite=settings.env_debian_suite,
        debian_mirror=settings.env_debian_mirror, system_max_bytes=settings.env_system_max_bytes,
    )


def local_environments(default_root: Path, *, sandboxed: bool, systems: bool) -> SkillEnvironments:
    """The local runtime's environments: in ``SKILLRUN_ENVS_DIR`` or else ``default_root``, built for the host's
    ``python3``; each build step sandboxed as a user of its own when ``sandboxed`` (root hosts); with ``systems``,
    skills' Debian packages in root filesystems of their own (``worker.environments.systems``: the sandbox's)."""
    root = get_worker_settings().envs_dir or default_root
    return SkillEnvironments(EnvironmentBuilder(EnvironmentStore(root), build_settings(sandboxed=sandboxed)), local_target,
                             systems=systems)


__all__ = [
    "MANIFEST_FILE",
    "NO_ENVIRONMENT",
    "BuildSettings",
    "Declaration",
    "DeclarationCache",
    "EnvironmentBuilder",
    "EnvironmentInfo",
    "EnvironmentStatus",
    "EnvironmentStore",
    "Manifest",
    "NodeStatus",
    "RunEnvironment",
    "SkillEnvironments",
    "Target",
    "build_settings",
    "bundle_digest",
    "image_status",
    "image_tag",
    "local_environments",
    "local_target",
    "read_declaration",
    "read_manifest",
]
