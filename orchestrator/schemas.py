"""The public models every front end shares: the HTTP API's request and answer bodies, which the console's forms and
the service layer (``orchestrator.services``) take and give too."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from orchestrator.errors import UnencodableTextError
from orchestrator.events import Event
from orchestrator.libraries import LIBRARY_NAME
from orchestrator.text import check_text
from worker import defaults
from worker.contract import (
    SKILL_NAME_PATTERN,
    WORKSPACE_ID_PATTERN,
    Base64Bytes,
    RunLimits,
    RunResult,
    RuntimeName,
)
from worker.names import ALLOWED_ENV_NAME, ENV_NAME, MAX_ENV_NAME_CHARS
from worker.run_store import RunRecord, RunStatus, WorkspaceEntry
from worker.secrets import MAX_VALUE_BYTES, MIN_VALUE_BYTES, SecretInfo
from worker.validation import (
    INPUT_NAME_PATTERN,
    MAX_COMMAND_CHARS,
    MAX_ENV_VALUE_CHARS,
    MAX_ENV_VARS,
    MAX_INPUTS,
    MAX_OUTPUT_PATTERNS,
    MAX_PATH_CHARS,
)

SESSION_ID = r"^[A-Za-z0-9._-]{1,64}$"
RUN_ID = r"^[A-Za-z0-9_-]{1,64}$"
WORKSPACE_ID = WORKSPACE_ID_PATTERN.pattern
MAX_MESSAGE_CHARS = 100_000
MAX_URL_CHARS = 2048
MAX_QUERY_CHARS = 10_000
"""The longest skill search (``q``) the API and the console take."""
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"

SkillName = Annotated[str, StringConstraints(pattern=SKILL_NAME_PATTERN.pattern, max_length=64)]
LibraryName = Annotated[str, StringConstraints(pattern=LIBRARY_NAME.pattern)]
PathText = Annotated[str, StringConstraints(max_length=MAX_PATH_CHARS)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME.pattern, max_length=MAX_ENV_NAME_CHARS)]
EnvValue = Annotated[str, StringConstraints(max_length=MAX_ENV_VALUE_CHARS)]


def _env_schema(schema: dict[str, Any]) -> None:
    """Every variable's name must match (``propertyNames``), not only those that match (``patternProperties``), and
    the names a run may not set are left out; the API's own check (``validate_env``) says which rule a name broke."""
    (value,) = schema.pop("patternProperties").values()
    schema["propertyNames"] = {"pattern": ALLOWED_ENV_NAME.pattern, "maxLength": MAX_ENV_NAME_CHARS}
    schema["additionalProperties"] = value


class RequestModel(BaseModel):
    """A request body: every string in it, at any depth and keys included, must be text a store can keep — one
    holding a lone surrogate is refused (422, ``lone_surrogate``, naming the field) before anything is stored or run
    (``orchestrator.text``)."""

    @model_validator(mode="before")
    @classmethod
    def _names_are_text(cls, data: Any) -> Any:
        """The body's own keys (a field's value is checked by ``_values_are_text``)."""
        if isinstance(data, dict):
            _refuse_lone_surrogates(dict.fromkeys(data), "")
        return data

    @field_validator("*", mode="before")
    @classmethod
    def _values_are_text(cls, value: Any, info: ValidationInfo) -> Any:
        _refuse_lone_surrogates(value, info.field_name or "")
        return value


def _refuse_lone_surrogates(value: Any, where: str) -> None:
    try:
        check_text(value, where)
    except UnencodableTextError as exc:
        raise PydanticCustomError("lone_surrogate", "{problem}", {"problem": str(exc)}) from None


class SessionCreate(RequestModel):
    """A new session; the id is generated when not given."""

    session_id: str | None = Field(default=None, pattern=SESSION_ID)
    state: dict[str, Any] = Field(default_factory=dict)


class SessionPublic(BaseModel):
    id: str
    app_name: str
    user_id: str
    state: dict[str, Any]
    events: list[Event]
    last_update_time: float


class MessageCreate(RequestModel):
    """A user message to the session's agent."""

    text: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)


class Health(BaseModel):
    status: str
    skills: int


class SkillSummaryPublic(BaseModel):
    name: str
    description: str


class DerivedImagePublic(BaseModel):
    """The Docker runtime's image with a skill's Debian packages (the sandbox image plus them, tagged by content)."""

    tag: str
    state: Literal["ready", "building", "not built", "failed"] = Field(
        description="failed: apt's own message is in message."
    )
    packages: list[str] = Field(description="The Debian packages it adds.")
    message: str


class NodeEnvironmentPublic(BaseModel):
    """A skill's Node environment on one runtime: its package.json's dependencies, installed with npm."""

    state: Literal["ready", "building", "not built", "failed", "invalid"] = Field(
        description="failed: npm's own message is in message; invalid: no node and npm where runs need them."
    )
    dependencies: list[str] = Field(description="What it declares, name@spec (package.json and skillrun.toml).")
    target: str = Field(description="The node it is built for (runtime, version, machine).")
    key: str | None = Field(description="The built environment's content key (shared by skills with the same files).")
    packages: list[str] = Field(description="Every package npm installed, name@version.")
    size_bytes: int | None
    message: str


class EnvironmentPublic(BaseModel):
    """A skill's dependency environment on one runtime: what the skill declares and where its build stands."""

    runtime: Literal["local", "docker"] = Field(description="The runtime this environment is for.")
    state: Literal["none", "ready", "building", "not built", "failed", "invalid"] = Field(
        description="none: it declares no packages (on local: no Python packages); ready: built (on docker: its "
                    "environment and, for Debian packages, its image); building: being built (or queued for it); "
                    "not built (on docker also: no Docker worker has built for the sandbox image yet); failed: the "
                    "build failed (message: the resolver's, installer's or apt's own words); invalid: the "
                    "declaration is wrong (message: which file and line)."
    )
    python: list[str] = Field(description="The Python requirements it declares (PEP 508).")
    debian: list[str] = Field(description="Debian packages it declares (installed in the Docker runtime's image).")
    requires_python: str | None
    declared_in: list[str] = Field(description="Where: requirements.txt, pyproject.toml, scripts (PEP 723), "
                                               "package.json, package-lock.json, the library's skillrun.toml.")
    target: str = Field(description="What the environment is built for (runtime, interpreter, machine).")
    key: str | None = Field(description="The built environment's content key (shared by skills with the same lock).")
    packages: list[str] = Field(description="Every package of the lock, name==version.")
    size_bytes: int | None
    message: str = Field(description="Why it failed, what the build is doing, or a note.")
    image: DerivedImagePublic | None = Field(
        description="On docker, for a skill with Debian packages: the derived image they are installed in."
    )
    node: NodeEnvironmentPublic | None = Field(
        default=None, description="For a skill with Node dependencies: its Node environment (ready only with it)."
    )


class SkillWarningPublic(BaseModel):
    """What a usable skill's front matter does that the Agent Skills format does not allow."""

    field: str
    message: str


class SkillPublic(SkillSummaryPublic):
    body: str
    tools: list[str]
    docs: list[str]
    warnings: list[SkillWarningPublic] = Field(
        default_factory=list, description="Its front matter's departures from the Agent Skills format (a description "
                                          "over 1,024 characters, a field the format does not have); refusals instead "
                                          "where the server asks for strict skills (SKILLRUN_STRICT_SKILLS).")
    environment: EnvironmentPublic = Field(
        description="Its dependency environment on the first runtime the server prepares for (SKILLRUN_PREPARE_RUNTIMES)."
    )
    environments: list[EnvironmentPublic] = Field(description="Its dependency environment on each of those runtimes.")


class InputContent(RequestModel):
    """A file for ``work/inputs/<name>``, its content base64-encoded."""

    model_config = ConfigDict(extra="forbid")

    name: PathText = Field(min_length=1, json_schema_extra={"pattern": INPUT_NAME_PATTERN})
    content: Annotated[Base64Bytes, WithJsonSchema({"type": "string", "contentEncoding": "base64", "pattern": BASE64})]


class RunCreate(RequestModel):
    """The fields of a run request a caller may set; the skill is named, the server finds it in the library."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    skill: SkillName
    command: str = Field(min_length=1, max_length=MAX_COMMAND_CHARS)
    cwd: PathText | None = None
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=MAX_ENV_VARS, json_schema_extra=_env_schema)
    timeout: float = Field(default=defaults.RUN_TIMEOUT_SECONDS, gt=0, le=defaults.MAX_RUN_TIMEOUT_SECONDS,
                           description="Seconds; at most the server's SKILLRUN_MAX_TIMEOUT_SECONDS.")
    output_files: list[PathText] = Field(default_factory=list, max_length=MAX_OUTPUT_PATTERNS)
    inputs: list[InputContent] = Field(default_factory=list, max_length=MAX_INPUTS)
    runtime: RuntimeName = RuntimeName.LOCAL
    limits: RunLimits = Field(default_factory=RunLimits)
    save_as_artifacts: bool = False
    omit_inline_content: bool = False
    network: bool = False
    workspace_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,30}$",
                                     description="Runs with the same id share work/ and out/ (within the team).")
    keep_workspace: bool | None = Field(
        default=None,
        description="Keep the workspace after the run (default: kept when workspace_id is given; without one the "
                    "run gets a workspace of its own, removed once its result is stored — output files and "
                    "artifacts stay readable through the run).",
    )
    priority: bool = Field(default=False, description="Put the run at the front of its queue.")
    wait_for_environment: bool = Field(
        default=True,
        description="When the skill's dependency environment (local runtime) is not ready: build it before the run "
                    "(true), or refuse the run at once with 409, saying why (false).",
    )
    secrets: list[EnvName] = Field(
        default_factory=list, max_length=32,
        description="The team's secrets to give the command as environment variables (each declared by the skill in "
                    "its front matter's metadata.secrets, and stored with PUT /v1/secrets/{name}); their values are "
                    "redacted from everything the run gives back.",
    )


class SecretSet(RequestModel):
    """A secret's value, written once; no answer ever holds it."""

    model_config = ConfigDict(extra="forbid")

    value: SecretStr = Field(min_length=MIN_VALUE_BYTES, max_length=MAX_VALUE_BYTES,
                             description=f"{MIN_VALUE_BYTES} to {MAX_VALUE_BYTES} bytes of UTF-8, no NUL.")


class SecretsPublic(BaseModel):
    data: list[SecretInfo]
    count: int


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


class WorkspacePublic(BaseModel):
    """A kept workspace of the team: its work/ and out/ persist across the runs that name it."""

    id: str = Field(description="As runs name it: <team>.<the workspace_id runs were given>.")
    runtime: RuntimeName = Field(description="Where it lives; its runs run there.")
    state: Literal["kept", "removing"] = Field(description="removing: a worker of its runtime is removing it "
                                                           "(new runs of it are refused meanwhile).")
    created_at: float
    last_used_at: float = Field(description="When a run of it was last accepted or ended.")
    removed_when_idle_at: float | None = Field(
        description="When it is removed unless a run uses it first (SKILLRUN_WORKSPACE_IDLE_SECONDS after its last "
                    "use); null while runs are in it.")
    runs: list[str] = Field(description="Runs queued or running in it.")

    @classmethod
    def of(cls, entry: WorkspaceEntry, idle_seconds: float | None) -> "WorkspacePublic":
        idle = None if entry.runs or idle_seconds is None else entry.last_used_at + idle_seconds
        return cls(id=entry.id, runtime=entry.runtime, state=entry.state, created_at=entry.created_at,
                   last_used_at=entry.last_used_at, removed_when_idle_at=idle, runs=entry.runs)


class WorkspacesPublic(BaseModel):
    data: list[WorkspacePublic] = Field(description="Oldest first.")
    count: int = Field(description="Workspaces on this page.")
    total: int = Field(description="Workspaces the team keeps.")
    next_offset: int | None = Field(description="The offset of the next page; null on the last.")


class LibraryCreate(RequestModel):
    """Register (a new version of) a library from the URL of an archive or of one SKILL.md."""

    model_config = ConfigDict(extra="forbid")

    name: LibraryName
    url: str = Field(pattern=r"^https?://[^\s/?#]+", max_length=MAX_URL_CHARS)


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


class SkillEnvironmentPublic(EnvironmentPublic):
    skill: str


class LibraryEnvironmentsPublic(BaseModel):
    """The dependency environments of one library version's skills, on each runtime the server prepares for."""

    library: str
    version: int
    done: bool = Field(description="No environment is being built (poll until true).")
    skills: list[SkillEnvironmentPublic] = Field(
        description="One entry per runtime (SKILLRUN_PREPARE_RUNTIMES, in that order) and skill."
    )
    problems: list[str] = Field(description="What is wrong beyond single skills: a skillrun.toml that cannot be "
                                            "read, or that names skills the library does not have.")


class LibraryRegistered(LibraryPublic):
    """A registered library, and its new current version's environments (being built unless ready)."""

    environments: LibraryEnvironmentsPublic


class CurrentVersion(RequestModel):
    version: int = Field(ge=1)
