"""Settings of the control plane, from the environment (``SKILLRUN_*``, plus the guide's ``SKILLS_ROOT``) or ``.env``."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SKILLS_ROOT = "./skills"


class Settings(BaseSettings):
    """Everything the orchestrator reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="SKILLRUN_", env_file=".env", extra="ignore")

    skills_root: str = Field(
        default=DEFAULT_SKILLS_ROOT,
        validation_alias=AliasChoices("SKILLS_ROOT", "SKILLRUN_SKILLS_ROOT"),
        description="Skills roots, comma-separated.",
    )
    work_root: Path | None = Field(default=None, description="Where workspaces are created (default: the temp dir).")
    artifacts_dir: Path | None = Field(default=None, description="Where artifacts are stored (default: under work_root).")

    def skills_roots(self) -> list[str]:
        return [part.strip() for part in self.skills_root.split(",") if part.strip()]


@lru_cache
def get_settings() -> Settings:
    return Settings()
