"""``dispatcher_for(settings)``: the dispatcher a server process uses, and the artifact store its runs' files go to.

With ``SKILLRUN_REDIS_URL`` runs go onto the queue for ``skillrun worker`` processes, and artifacts are served from
the store the workers write (``SKILLRUN_BLOB_URL`` or ``SKILLRUN_ARTIFACTS_DIR``, else the work root's); without it
(the embedded default) runs execute in this process on the local runtime. The API and ``skillrun mcp`` both build
theirs here, and ``secret_store_for`` the teams' secrets.
"""

from __future__ import annotations

import redis

from orchestrator.code_executors import create_local_workspace_runtime
from orchestrator.config import Settings
from orchestrator.dispatch.base import BaseDispatcher
from orchestrator.dispatch.inline import InlineDispatcher
from orchestrator.dispatch.queue import QueueDispatcher
from worker.artifacts import BaseArtifactStore, FileArtifactStore, create_artifact_store
from worker.secrets import FileSecretStore, RedisSecretStore, SecretStore, box_from
from worker.workspaces import REGISTRY_DIR, default_work_root


def secret_store_for(settings: Settings) -> SecretStore:
    """Where the teams' secrets are kept: beside the queue in Redis, else in files under the data dir. Without
    ``SKILLRUN_SECRETS_KEY`` the store lists and removes, and refuses to store or reveal a value."""
    box = box_from(settings.secrets_key)
    if settings.redis_url:
        return RedisSecretStore(redis.Redis.from_url(settings.redis_url), box)
    return FileSecretStore(settings.data_dir / "secrets", box)


def dispatcher_for(settings: Settings) -> tuple[BaseDispatcher, BaseArtifactStore]:
    configured = create_artifact_store(settings.blob_url, settings.artifacts_dir)
    if settings.redis_url:
        dispatcher = QueueDispatcher(
            settings.redis_url, max_attempts=settings.max_attempts, result_ttl=settings.result_ttl_seconds,
            workspace_limit=settings.max_workspaces_per_team, workspace_idle_seconds=settings.workspace_idle_seconds,
        )
        return dispatcher, configured or FileArtifactStore(default_work_root() / REGISTRY_DIR / "artifacts")
    runtime = create_local_workspace_runtime(settings.work_root, artifact_store=configured)
    inline = InlineDispatcher(
        {"local": runtime}, result_ttl=settings.result_ttl_seconds, workspace_limit=settings.max_workspaces_per_team,
        workspace_idle_seconds=settings.workspace_idle_seconds, secrets=secret_store_for(settings),
    )
    return inline, runtime.artifact_store
