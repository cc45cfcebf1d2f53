"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.events import Event
from worker import defaults
from worker.contract import Base64Bytes, RunLimits, RunResult, RuntimeName
from worker.run_store import RunRecord, RunStatus


class SessionCreate(BaseModel):
    """A new session; the id is generated when not given."""

    session_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,64}$")
    state: dict[str, Any] = Field(default_factory=dict)


class SessionPublic(BaseModel):
    id: str
    app_name: str
    user_id: str
    state: dict[str, Any]
    events: list[Event]
    last_update_time: float


class MessageCreate(BaseModel):
    """A user message to the session's agent."""

    text: str = Field(min_length=1)


class Health(BaseModel):
    status: str
    skills: int


class SkillSummaryPublic(BaseModel):
    name: str
    description: str


class SkillPublic(SkillSummaryPublic):
    body: str
    tools: list[str]
    docs: list[str]


class InputContent(BaseModel):
    """A file for ``work/inputs/<name>``, its content base64-encoded."""

    model_config = ConfigDict(extra="forbid")

    name: str
    content: Base64Bytes


class RunCreate(BaseModel):
    """The fields of a run request a caller may set; the skill is named, the server finds it in the library."""

    model_config = ConfigDict(extra="forbid")

    skill: str
    command: str = Field(min_length=1)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=defaults.RUN_TIMEOUT_SECONDS, gt=0, le=defaults.MAX_RUN_TIMEOUT_SECONDS)
    output_files: list[str] = Field(default_factory=list)
    inputs: list[InputContent] = Field(default_factory=list)
    runtime: RuntimeName = RuntimeName.LOCAL
    limits: RunLimits = Field(default_factory=RunLimits)
    save_as_artifacts: bool = False
    omit_inline_content: bool = False
    network: bool = False
    workspace_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,30}$",
                                     description="Runs with the same id share work/ and out/ (within the team).")
    priority: bool = Field(default=False, description="Put the run at the front of its queue.")


class RunPublic(BaseModel):
    id: str
    status: RunStatus
    skill: str
    runtime: RuntimeName
    workspace_id: str
    attempts: int
    worker_id: str | None
    error: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    result: RunResult | None

    @classmethod
    def of(cls, record: RunRecord) -> "RunPublic":
        return cls(
            id=record.id, status=record.status, skill=record.request.skill.name, runtime=record.request.runtime,
            workspace_id=record.request.workspace_id, attempts=record.attempts, worker_id=record.worker_id,
            error=record.error, created_at=record.created_at, started_at=record.started_at,
            finished_at=record.finished_at, result=record.result,
        )


class RunsPublic(BaseModel):
    data: list[RunPublic]
    count: int


class LibraryCreate(BaseModel):
    """Register (a new version of) a library from the URL of an archive or of one SKILL.md."""

    model_config = ConfigDict(extra="forbid")

    name: str
    url: str


class LibraryVersionPublic(BaseModel):
    version: int
    sha256: str
    size: int
    skill_count: int
    source: str
    created_at: float


class LibraryPublic(BaseModel):
    name: str
    current: int | None
    versions: list[LibraryVersionPublic]


class CurrentVersion(BaseModel):
    version: int
