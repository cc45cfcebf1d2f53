"""Settings of the execution plane (``SKILLRUN_*``), read by queue workers."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker import defaults


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SKILLRUN_", env_file=".env", extra="ignore")

    redis_url: str | None = Field(default=None, description="The Redis the run queue lives in.")
    work_root: Path | None = Field(default=None, description="Where workspaces are created; shared by all workers.")
    artifacts_dir: Path | None = Field(default=None, description="Where artifacts are stored; shared by all workers.")
    result_ttl_seconds: int = Field(default=defaults.RESULT_TTL_SECONDS, gt=0)
    workspace_disk_bytes: int | None = Field(
        default=None, description="Give each workspace a file system of this size (root; loop-mounted ext4)."
    )
    heartbeat_ttl_seconds: int = Field(
        default=defaults.HEARTBEAT_TTL_SECONDS, ge=2, description="Silence after which a started run's worker is lost."
    )


@lru_cache
def get_worker_settings() -> WorkerSettings:
    return WorkerSettings()
