"""Numeric defaults of the execution plane, each named with its unit."""

from __future__ import annotations

RUN_TIMEOUT_SECONDS = 300.0
MAX_RUN_TIMEOUT_SECONDS = 24 * 3600.0

CPU_SECONDS = 600
MEMORY_BYTES = 4 * 1024**3
FILE_SIZE_BYTES = 1024**3
OPEN_FILES = 1024
PROCESSES = 512

STDOUT_BYTES = 1024 * 1024
STDERR_BYTES = 1024 * 1024

OUTPUT_FILE_BYTES = 4 * 1024 * 1024
OUTPUT_TOTAL_BYTES = 16 * 1024 * 1024
OUTPUT_MAX_FILES = 1000
ARTIFACT_TOTAL_BYTES = 512 * 1024 * 1024
"""What one run's artifacts may hold together (each file counted at its full size, a sparse one too)."""

INPUT_FILE_BYTES = 64 * 1024 * 1024

KILL_GRACE_SECONDS = 0.5
"""How long the pipes of a killed command are drained before they are closed."""

SANDBOX_UID_BASE = 30000
SANDBOX_UID_COUNT = 30000
"""Range of user ids handed to workspaces when the host process runs as root."""
UID_REGISTRY_DIR = "/var/lib/skillrun/uids"
"""Where the host's sandbox user ids are recorded (``worker.workspaces.user_ids``): one registry for every work root."""

SANDBOX_TMPFS_BYTES = 64 * 1024 * 1024
"""Size of the private /tmp and, again, of /dev/shm of a sandboxed local run (memory the run's group pays for)."""
SANDBOX_CPUS = 1.0
"""CPU time a sandboxed local run may use at once, in cores (its control group's quota)."""
DOCKER_POOL_CONTAINERS = 2
DOCKER_POOL_MAX = 64
OCI_RUNTIME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_RUN_CPUS = 1024
"""Warm containers the Docker runtime keeps ready for new workspaces when built by name (``resolve_runtime``)."""

SANDBOX_WORKSPACE_ALIAS = "/workspace"
"""The workspace's second, short path in every sandbox. A run's ``TMPDIR`` is its run folder by this path, so the
sockets programs make under ``TMPDIR`` (Chromium's, tmux's, an ssh agent's) fit in the 108 bytes a socket's path may
have, which the workspace's own path (a host path, ``ws_<id>_<owner>``) leaves no room for."""
SANDBOX_TOOLS_DIR = "/opt/skillrun/bin"
"""What every sandbox adds to the system's programs, last on its PATH: ``python`` (python3) where the system has
python3 alone."""
SANDBOX_PATH = f"/usr/local/bin:/usr/bin:/bin:{SANDBOX_TOOLS_DIR}"
SANDBOX_LANG = "C.UTF-8"

RESULT_TTL_SECONDS = 24 * 3600
"""How long a finished run's record and result are kept."""

JOB_RESULT_TTL_SECONDS = 0
"""How long RQ keeps a finished job's summary: not at all, the run record keeps the result. The job's hash goes in
the transaction that ends it (``worker.jobs.queue_worker.RunWorker``): one command where a kept summary costs nine,
and nothing left for the finished-job registries' sweep."""

JOB_TIMEOUT_MARGIN_SECONDS = 60
"""Added to a run's own timeout for the queue's job timeout (the runtime enforces the run's timeout itself)."""

HEARTBEAT_SECONDS = 1.0
HEARTBEAT_TTL_SECONDS = 10
"""A started run whose worker has not beaten for this long is lost: retried or failed."""

MAX_ATTEMPTS = 2

TRUNCATION_MARKER = "\n[skillrun: output truncated here; {omitted} more bytes were not kept]\n"
"""What ends a command's stdout or stderr that was cut at its cap."""
