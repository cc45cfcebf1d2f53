"""Settings of the execution plane (``SKILLRUN_*``), read by queue workers, and the settings both planes share
(``PlaneSettings``, which the control plane's settings extend)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker import defaults
from worker.artifacts.location import BlobUrl
from worker.names import RuntimeName
from worker.jobs.tokens import usable_worker_token

MAX_CPU_SECONDS = 24 * 3600
"""Default operator ceiling on a run's ``limits.cpu_seconds``."""
MAX_PROCESSES = 4096
"""Default operator ceiling on a run's ``limits.processes``."""
DEFAULT_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
"""Debian's CA bundle: what environment builds trust unless told otherwise."""
DEFAULT_URL_CACHE_BYTES = 4 * 1024**3
"""Default bound on the URL-root cache, bytes (extracted libraries, every version of every URL together)."""


def host_memory_bytes() -> int:
    """The host's physical memory, bytes: the default ceiling on a run's ``limits.memory_bytes`` (never below the
    default limit, so a request that leaves the limit alone runs on a small host too)."""
    return max(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), defaults.MEMORY_BYTES)


class PlaneSettings(BaseSettings):
    """The settings both planes read, declared once: where runs, workspaces and artifacts live, how long records are
    kept, and the secrets the API and its workers share. An empty variable means unset (Compose passes one it was
    not given as empty): its default applies, never an empty path or URL."""

    model_config = SettingsConfigDict(env_prefix="SKILLRUN_", env_file=".env", extra="ignore", env_ignore_empty=True,
                                      hide_input_in_errors=True)  # a refused value may hold a secret

    redis_url: str | None = Field(default=None, description="The Redis of the run queue, run records, sessions and "
                                                            "registries (unset: the embedded default, in process).")
    work_root: Path | None = Field(default=None, description="Where workspaces are created (default: the temp dir "
                                                             "as root, else ~/.cache/skillrun: a folder of the "
                                                             "account's own); shared by all workers of a host.")
    artifacts_dir: Path | None = Field(default=None, description="Where artifacts are stored (default: under "
                                                                 "work_root); the API's and the workers' the same.")
    blob_url: BlobUrl | None = Field(
        default=None, description="The artifact store, instead of artifacts_dir: file:///path, or s3://bucket/prefix "
                                  "(?endpoint=http://host:port for MinIO and other S3-protocol servers; credentials "
                                  "from boto3's chain, such as AWS_ACCESS_KEY_ID). The API's and the workers' the same.",
    )
    result_ttl_seconds: int = Field(default=defaults.RESULT_TTL_SECONDS, gt=0,
                                    description="How long run records (results, output files) are kept after the run.")
    api_url: str | None = Field(
        default=None, pattern=r"^https?://",
        description="Where the API is. A worker on a host without the API's libraries folder fetches the library "
                    "versions its runs need from it by sha256 (with worker_token) into the URL-root cache; the "
                    "command line's API commands (skillrun workspaces) talk to it (unset: http://127.0.0.1:8000).",
    )
    worker_token: SecretStr | None = Field(
        default=None, description="The secret workers show the API to fetch library archives "
                                  "(GET /v1/worker/libraries/<sha256>); unset on the API, that route is off. At least "
                                  "24 characters.",
    )
    secrets_key: SecretStr | None = Field(
        default=None, description="The operator's key team secrets are encrypted with: one or more Fernet keys, "
                                  "comma-separated (the first encrypts; any decrypts, to rotate). The API's and the "
                                  "workers' the same. The API refuses to start with stored secrets and no key.",
    )

    @field_validator("worker_token")
    @classmethod
    def _usable_token(cls, value: SecretStr | None) -> SecretStr | None:
        return usable_worker_token(value)


class WorkerSettings(PlaneSettings):
    """Where a worker keeps things, and the operator's ceilings on what a run request may ask for (enforced by
    ``worker.validation.validate_request`` in workers and, before queueing, in the API)."""

    artifact_ttl_seconds: int | None = Field(
        default=None, gt=0,
        description="How long an artifact version is kept after it was stored; at least result_ttl_seconds, which "
                    "is the default.",
    )
    workspace_disk_bytes: int | None = Field(
        default=None, description="Give each workspace a file system of this size (root; loop-mounted ext4)."
    )
    uid_registry: Path = Field(
        default=Path(defaults.UID_REGISTRY_DIR),
        description="Where sandbox user ids are recorded: one folder for every work root of a host (workers in "
                    "containers that share a work root share it too: put it on that volume).",
    )
    run_cpus: float = Field(
        default=defaults.SANDBOX_CPUS, gt=0, le=defaults.MAX_RUN_CPUS, allow_inf_nan=False,
        description="CPU cores a run of the local or Docker runtime may use at once (its control group's quota).",
    )
    run_tmpfs_bytes: int = Field(
        default=defaults.SANDBOX_TMPFS_BYTES, ge=1024 * 1024, le=1024**4,
        description="Size of a run's private /tmp (and, on the local runtime, /dev/shm) on the local or Docker runtime.",
    )
    local_sandbox: bool = Field(
        default=True,
        description="Run the local runtime's commands in its bubblewrap sandbox, as root or as any other account "
                    "(unprivileged user namespaces); false runs them unsandboxed, as this account, and every result "
                    "says so. Where the sandbox cannot be made, runs fail saying why rather than run without it.",
    )
    docker_oci_runtime: str = Field(
        default="runc", pattern=defaults.OCI_RUNTIME_PATTERN,
        description="The OCI runtime the Docker runtime's containers run under: runc, or runsc for gVisor (registered "
                    "with the engine, see the README).",
    )
    docker_pool_size: int = Field(
        default=defaults.DOCKER_POOL_CONTAINERS, ge=0, le=defaults.DOCKER_POOL_MAX,
        description="Warm containers the Docker runtime keeps ready for new workspaces (0: none).",
    )
    url_cache_bytes: int = Field(
        default=DEFAULT_URL_CACHE_BYTES, gt=0,
        description="The most the cache of URL roots (SKILLS_CACHE_DIR) may hold, bytes; past it the least recently "
                    "used versions no run is using are removed.",
    )
    envs_dir: Path | None = Field(
        default=None, description="Where skills' dependency environments are built and kept (default: under the "
                                  "work root's .skillrun folder).",
    )
    env_index_url: str | None = Field(
        default=None, description="The package index environment builds resolve and download from (default: PyPI)."
    )
    env_npm_registry: str = Field(
        default="https://registry.npmjs.org/", description="The npm registry Node environment builds install from.",
    )
    env_allowed_hosts: str = Field(
        default="", description="Hosts environment builds may reach besides the package index's own: host[:port] "
                                "items (port 443 unless given), separated by commas; each must resolve to public "
                                "addresses only (the index's host alone may be private).",
    )
    egress_pinned_hosts: str = Field(
        default="", description="For tests and private deployments only: name=address items (comma-separated) that "
                                "egress proxies (builds' and runs') connect to for these names instead of resolving "
                                "them, the address trusted even if private. A name must still be on the sandbox's "
                                "allow-list. Empty (the default): every name is resolved and must be public.",
    )
    env_ca_bundle: str | None = Field(
        default_factory=lambda: DEFAULT_CA_BUNDLE if os.path.isfile(DEFAULT_CA_BUNDLE) else None,
        description="CA bundle environment builds trust for the index (where TLS is intercepted, the one that "
                    "holds the intercepting CA).",
    )
    env_build_timeout_seconds: float = Field(
        default=900.0, gt=0, allow_inf_nan=False, description="The longest one environment build step may take."
    )
    env_max_bytes: int = Field(default=1024**3, gt=0, description="The largest an environment may grow, bytes.")
    env_debian_suite: str | None = Field(
        default=None, pattern=r"^[a-z][a-z0-9-]{1,31}$",
        description="The release the local runtime's root filesystems for skills' Debian packages are built of "
                    "(default: the host's own, from /etc/os-release).",
    )
    env_debian_mirror: str | None = Field(
        default=None, pattern=r"^https?://[^\s]+$",
        description="The archive those root filesystems are built from (default: http://deb.debian.org/debian, or "
                    "Ubuntu's archive on an Ubuntu host).",
    )
    env_system_max_bytes: int = Field(
        default=4 * 1024**3, gt=0, description="The largest a root filesystem for skills' Debian packages may grow, "
                                               "bytes.",
    )
    env_build_memory_bytes: int = Field(
        default=4 * 1024**3, gt=0, description="Memory an environment build may use (its control group's limit)."
    )
    library_fetch_seconds: float = Field(
        default=300.0, gt=0, allow_inf_nan=False, description="The longest fetching one library archive from the API "
                                                              "may take.",
    )
    heartbeat_ttl_seconds: int = Field(
        default=defaults.HEARTBEAT_TTL_SECONDS, ge=2, description="Silence after which a started run's worker is lost."
    )
    max_timeout_seconds: float = Field(
        default=defaults.MAX_RUN_TIMEOUT_SECONDS, gt=0, allow_inf_nan=False,
        description="The longest timeout a run request may ask for, seconds.",
    )
    max_cpu_seconds: int = Field(default=MAX_CPU_SECONDS, gt=0, description="The most CPU seconds a run may ask for.")
    max_memory_bytes: int = Field(
        default_factory=host_memory_bytes, gt=0, description="The most memory a run may ask for (default: the host's)."
    )
    max_processes: int = Field(default=MAX_PROCESSES, gt=0, description="The most processes a run may ask for.")

    @model_validator(mode="after")
    def _artifacts_outlive_records(self) -> "WorkerSettings":
        if self.artifact_ttl_seconds is not None and self.artifact_ttl_seconds < self.result_ttl_seconds:
            raise ValueError("artifact_ttl_seconds must be at least result_ttl_seconds (a kept run names its artifacts)")
        return self

    @property
    def artifacts_kept_seconds(self) -> int:
        """How long artifact versions are kept."""
        return self.artifact_ttl_seconds or self.result_ttl_seconds

    def runtime_options(self, name: str | RuntimeName) -> dict[str, Any]:
        """The keyword arguments the runtime called ``name`` takes from these settings — workspace disk size, run
        CPUs and ``/tmp`` size, the local runtime's sandbox, the Docker runtime's OCI runtime and warm pool — which
        ``resolve_runtime`` gives it unless its caller names them: workers, the CLI and the Python API build runtimes
        alike. Where workspaces and artifacts go is the caller's (each plane has its own ``work_root``)."""
        options: dict[str, Any] = {}
        if self.workspace_disk_bytes is not None:
            options["disk_bytes"] = self.workspace_disk_bytes
        if name in (RuntimeName.LOCAL, RuntimeName.DOCKER):
            options |= {"cpus": self.run_cpus, "tmpfs_bytes": self.run_tmpfs_bytes}
        if name == RuntimeName.LOCAL:
            options["sandbox"] = self.local_sandbox
        if name == RuntimeName.DOCKER:
            options |= {"oci_runtime": self.docker_oci_runtime, "pool_size": self.docker_pool_size}
        return options


@lru_cache
def get_worker_settings() -> WorkerSettings:
    return WorkerSettings()


class CubeCodeExecutorConfig(BaseSettings):
    """How to reach an E2B-compatible sandbox service (Cube) and what to ask of it.

    Read from ``E2B_API_URL``, ``E2B_API_KEY``, ``CUBE_TEMPLATE_ID`` (and the other variables named below) unless
    given as fields; fields win over the environment.
    """

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True, env_ignore_empty=True)

    api_url: str | None = Field(default=None, validation_alias="E2B_API_URL",
                                description="The sandbox service's control API; unset means E2B's own.")
    api_key: str | None = Field(default=None, validation_alias="E2B_API_KEY", repr=False)
    template_id: str = Field(default="base", validation_alias="CUBE_TEMPLATE_ID",
                             description="The sandbox template (image) new sandboxes start from.")
    sandbox_url: str | None = Field(default=None, validation_alias="E2B_SANDBOX_URL",
                                    description="Where the in-sandbox daemon answers, when not at E2B's sandbox domain.")
    domain: str | None = Field(default=None, validation_alias="E2B_DOMAIN")
    sandbox_id: str | None = Field(default=None, validation_alias="CUBE_SANDBOX_ID",
                                   description="Connect to this running sandbox instead of creating one.")
    execute_timeout: float = Field(default=defaults.RUN_TIMEOUT_SECONDS, gt=0, validation_alias="CUBE_EXECUTE_TIMEOUT",
                                   description="Longest any command may run in the sandbox, seconds.")
    sandbox_timeout: int = Field(default=3600, gt=0, validation_alias="CUBE_SANDBOX_TIMEOUT",
                                 description="Lifetime asked of the service for a new sandbox, seconds.")
    request_timeout: float = Field(default=30.0, gt=0, validation_alias="CUBE_REQUEST_TIMEOUT",
                                   description="Longest wait for one API or file request, seconds.")
    user: str = Field(default="user", validation_alias="CUBE_USER", description="The sandbox user commands run as.")
    allow_internet_access: bool = Field(default=False, validation_alias="CUBE_ALLOW_INTERNET",
                                        description="Give new sandboxes internet access (runs may then ask for network).")
    http_version: Literal["1.1", "2"] | None = Field(default=None, validation_alias="E2B_HTTP_VERSION")

    @field_validator("api_url", "api_key", "sandbox_url", "domain", "sandbox_id", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: object) -> object:
        """An empty variable (as Compose passes an unset one) means unset."""
        return None if value == "" else value

    def connection_options(self) -> dict[str, object]:
        """The keyword arguments the ``e2b`` SDK takes for these settings."""
        options: dict[str, object] = {"api_key": self.api_key, "request_timeout": self.request_timeout}
        for name in ("api_url", "sandbox_url", "domain", "http_version"):
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        return options


class CubeWorkspaceConfig(BaseSettings):
    """Where and how long workspaces live in Cube sandboxes."""

    model_config = SettingsConfigDict(env_prefix="CUBE_", env_file=".env", extra="ignore", env_ignore_empty=True)

    root: str = Field(default="/workspace/cube_agent", description="The folder in the sandbox workspaces go under.")
    idle_seconds: float = Field(default=600.0, gt=0,
                                description="A workspace's own sandbox unused this long is closed.")
