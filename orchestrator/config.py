"""Settings of the control plane, from the environment (``SKILLRUN_*``, plus the guide's ``SKILLS_ROOT``) or ``.env``."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator

from orchestrator.quotas import (
    MAX_ARTIFACT_BYTES_CEILING,
    MAX_BUILDS_CEILING,
    TeamQuota,
)
from worker import defaults as run_defaults
from worker.config import PlaneSettings

DEFAULT_SKILLS_ROOT = "./skills"
PREPARABLE_RUNTIMES = ("local", "docker")
"""Runtimes whose environments are built ahead of runs (a Cube sandbox installs its own when a run needs it)."""
DEFAULT_OVERVIEW_MAX_CHARS = 8000  # characters of skill lines; past this the overview is cut to the best matches
DEFAULT_OVERVIEW_SKILLS = 15  # skills described in a cut overview
DEFAULT_OVERVIEW_NAMES = 45  # further skills named (without description) in a cut overview
DEFAULT_SEARCH_PAGE_SIZE = 10  # skills per skill_search page
DEFAULT_WORKSPACE_IDLE_SECONDS = 24 * 3600
DEFAULT_MAX_WORKSPACES_PER_TEAM = 100
DEFAULT_TEAM_MAX_QUEUED = 10_000
DEFAULT_TEAM_MAX_BUILDS = 8
DEFAULT_TEAM_MAX_ARTIFACT_BYTES = 100 * 1024**3
"""Builds a team may have going at once by default: four library versions on each of two runtimes."""
DEFAULT_VERSIONS_KEPT = 10
DEFAULT_MAX_LIBRARIES = 50
LoadModeName = Literal["once", "turn", "session"]


class Settings(PlaneSettings):
    """Everything the orchestrator reads from its environment: the settings both planes share
    (``worker.config.PlaneSettings``) and the control plane's own."""

    skills_root: str = Field(
        default=DEFAULT_SKILLS_ROOT,
        validation_alias=AliasChoices("SKILLS_ROOT", "SKILLRUN_SKILLS_ROOT"),
        description="Skills roots, comma-separated.",
    )
    data_dir: Path = Field(
        default_factory=lambda: Path.home() / ".local" / "share" / "skillrun",
        description="Where the embedded default keeps sessions.",
    )
    libraries_dir: Path | None = Field(default=None, description="Where library versions are extracted (default: data_dir/libraries).")
    library_versions_kept: int = Field(
        default=DEFAULT_VERSIONS_KEPT, ge=1,
        description="Versions each library keeps (the newest, and its current one); older ones are removed.",
    )
    max_libraries_per_team: int = Field(
        default=DEFAULT_MAX_LIBRARIES, ge=1, description="Libraries a team may have; one more is refused (409).",
    )
    allow_private_library_urls: bool = Field(
        default=False, description="Let teams register library URLs on private or local addresses (trusted networks only)."
    )
    strict_skills: bool = Field(
        default=False,
        description="Refuse skills whose front matter the Agent Skills format does not allow (a description over "
                    "1,024 characters, a field it does not have) instead of using them with a warning.",
    )
    model: str = Field(default="gpt-4o-mini", description="The chat model's name at the OpenAI-compatible endpoint.")
    openai_api_key: str | None = Field(default=None, validation_alias=AliasChoices("OPENAI_API_KEY", "SKILLRUN_OPENAI_API_KEY"))
    openai_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_BASE_URL", "SKILLRUN_OPENAI_BASE_URL")
    )
    app_name: str = Field(default="skillrun", description="The app name sessions are filed under.")
    console_session_seconds: int = Field(
        default=8 * 3600, gt=0, le=30 * 24 * 3600,
        description="How long a web console sign-in lasts (signing out or revoking its key ends it sooner).",
    )
    console_sessions_per_team: int = Field(
        default=50, ge=1, description="Console sign-ins a team keeps at once; one more ends the team's oldest.",
    )
    max_attempts: int = Field(default=run_defaults.MAX_ATTEMPTS, ge=1, description="Tries of a run whose worker was lost.")
    workspace_idle_seconds: float = Field(
        default=DEFAULT_WORKSPACE_IDLE_SECONDS, gt=0, allow_inf_nan=False,
        description="A kept workspace no run has used for this long is removed (folder, user id, spawner, container, "
                    "sandbox), on a worker of its runtime.",
    )
    max_workspaces_per_team: int = Field(
        default=DEFAULT_MAX_WORKSPACES_PER_TEAM, gt=0,
        description="Kept workspaces a team may have at once; a run that would make one more is refused (409).",
    )
    team_max_running: int = Field(
        default=0, ge=0, le=100_000,
        description="Default quota: runs of one team started at once (0: no cap); more wait their turn.",
    )
    team_max_queued: int = Field(
        default=DEFAULT_TEAM_MAX_QUEUED, ge=0, le=10_000_000,
        description="Default quota: runs of one team waiting to start (0: no limit); one more is refused (429).",
    )
    team_max_builds: int = Field(
        default=DEFAULT_TEAM_MAX_BUILDS, ge=0, le=MAX_BUILDS_CEILING,
        description="Default quota: dependency-environment builds of one team (one per library version and runtime) "
                    "queued or under way at once (0: no limit); a registration that would start more is refused (429).",
    )
    team_max_artifact_bytes: int = Field(
        default=DEFAULT_TEAM_MAX_ARTIFACT_BYTES, ge=0, le=MAX_ARTIFACT_BYTES_CEILING,
        description="Default quota: bytes of artifacts one team's runs keep at once, within the artifacts' retention "
                    "(0: no limit); a run saving artifacts past it is refused (429).",
    )
    api_key: str | None = Field(default=None, repr=False, description="The team key those commands send.")
    max_steps: int = Field(default=25, gt=0, description="Model calls per message before the agent stops.")
    skill_overview_max_chars: int = Field(
        default=DEFAULT_OVERVIEW_MAX_CHARS, ge=0,
        description="Up to this many characters of skill lines the overview lists every skill; past it, the best matches.",
    )
    skill_overview_skills: int = Field(default=DEFAULT_OVERVIEW_SKILLS, ge=0, description="Skills described in a cut overview.")
    skill_overview_names: int = Field(default=DEFAULT_OVERVIEW_NAMES, ge=0, description="Further skills named in a cut overview.")
    skill_search_page_size: int = Field(default=DEFAULT_SEARCH_PAGE_SIZE, gt=0, description="Skills per skill_search page.")
    skill_load_mode: LoadModeName = Field(
        default="turn", description="How long a loaded skill stays: the next request (once), the message (turn), the session."
    )
    max_loaded_skills: int | None = Field(
        default=None, gt=0, description="Loaded skills kept at once; loading one more evicts the least recently used."
    )
    skill_content_in_tool_results: bool = Field(
        default=False, description="Return loaded bodies and docs as tool results instead of in the system message."
    )
    mcp_session_idle_seconds: float = Field(
        default=900, gt=0, allow_inf_nan=False,
        description="An MCP session of /mcp without a request for this long is ended: its runs cancelled, its "
                    "workspace removed.",
    )
    mcp_max_sessions: int = Field(default=1000, gt=0, description="MCP sessions /mcp holds at once; one more is refused.")
    mcp_max_sessions_per_team: int = Field(
        default=100, gt=0, description="MCP sessions one team may hold open at /mcp; one more is refused (429).",
    )
    mcp_output_file_bytes: int = Field(
        default=1024 * 1024, ge=0, le=256 * 1024**2,
        description="Bytes of one output file an MCP skill_run returns (past it the file is cut).",
    )
    mcp_output_total_bytes: int = Field(
        default=8 * 1024 * 1024, ge=0, le=1024**3, description="Bytes of output files an MCP skill_run returns in all.",
    )
    prepare_runtimes: str = Field(
        default="local",
        description="Runtimes whose dependency environments registering a library version prepares, comma-separated "
                    "(local, docker): those this deployment runs skills on. With Redis, each goes to that runtime's "
                    "workers (skillrun:<runtime>:environments).",
    )

    @field_validator("prepare_runtimes")
    @classmethod
    def _known_runtimes(cls, value: str) -> str:
        names = [part.strip() for part in value.split(",") if part.strip()]
        unknown = [name for name in names if name not in PREPARABLE_RUNTIMES]
        if unknown or not names:
            raise ValueError(f"runtimes to prepare must be some of {', '.join(PREPARABLE_RUNTIMES)} (got {value!r})")
        return ",".join(dict.fromkeys(names))

    def default_quota(self) -> TeamQuota:
        """The quota of a team that has none of its own (``skillrun teams set-quota``)."""
        return TeamQuota(max_running=self.team_max_running, max_queued=self.team_max_queued,
                         max_workspaces=self.max_workspaces_per_team, max_builds=self.team_max_builds,
                         max_artifact_bytes=self.team_max_artifact_bytes)

    def skills_roots(self) -> list[str]:
        return [part.strip() for part in self.skills_root.split(",") if part.strip()]

    def runtimes_to_prepare(self) -> list[str]:
        return self.prepare_runtimes.split(",")


@lru_cache
def get_settings() -> Settings:
    return Settings()


def libraries_dir(settings: Settings) -> Path:
    return settings.libraries_dir or settings.data_dir / "libraries"
