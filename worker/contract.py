"""The run contract: what a caller sends to a worker and what it gets back.

These models travel as JSON (over the queue and the HTTP API), never pickled. ``RunResult`` keeps the field
names of the guide's ``WorkspaceRunResult`` (``stdout, stderr, exit_code, timed_out, duration_ms,
output_files, artifact_files``) and adds the run's identity, per-phase timings and what was refused.
"""

from __future__ import annotations

import base64
import re
import uuid
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    PrivateAttr,
    field_validator,
    model_validator,
)

from worker import defaults
from worker.names import MAX_ENTRIES, RuntimeName, env_name_problem, parse_entries

# Also JSON-schema patterns (where "$" is the end); in Python, use fullmatch: match would let a final newline in
WORKSPACE_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TEAM_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
"""A team's name, which is its id (``orchestrator.teams``): what a run's owner and a secret's team are."""
SKILL_NAME_PATTERN = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def _decode_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except ValueError as exc:
            raise ValueError("content must be base64") from exc
    raise ValueError("content must be bytes or a base64 string")


Base64Bytes = Annotated[
    bytes,
    PlainValidator(_decode_bytes),
    PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str, when_used="json"),
]
"""Bytes in Python, a base64 string in JSON."""


class SkillRef(BaseModel):
    """Which skill to stage: its name and its folder inside a library root."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The skill's name from its SKILL.md.")
    root: str = Field(description="The library root the skill comes from: a directory, or the URL of an archive.")
    path: str = Field(default="", description="The skill's folder relative to the root; empty means the root itself.")
    digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                               description="sha256 of the root's archive (a URL root, or a library version's folder).")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not SKILL_NAME_PATTERN.fullmatch(value) or len(value) > 64:
            raise ValueError("skill name must be lowercase letters, digits and hyphens, at most 64 characters")
        return value


class RunLimits(BaseModel):
    """Resource limits of one run, each with a ceiling a request cannot go past."""

    model_config = ConfigDict(extra="forbid")

    cpu_seconds: int = Field(default=defaults.CPU_SECONDS, gt=0, le=24 * 3600)
    memory_bytes: int = Field(default=defaults.MEMORY_BYTES, gt=0, le=64 * 1024**3)
    file_size_bytes: int = Field(default=defaults.FILE_SIZE_BYTES, gt=0, le=64 * 1024**3)
    open_files: int = Field(default=defaults.OPEN_FILES, ge=16, le=65536)
    processes: int = Field(default=defaults.PROCESSES, gt=0, le=65536)
    stdout_bytes: int = Field(default=defaults.STDOUT_BYTES, ge=0, le=64 * 1024**2)
    stderr_bytes: int = Field(default=defaults.STDERR_BYTES, ge=0, le=64 * 1024**2)
    output_file_bytes: int = Field(default=defaults.OUTPUT_FILE_BYTES, ge=0, le=256 * 1024**2)
    output_total_bytes: int = Field(default=defaults.OUTPUT_TOTAL_BYTES, ge=0, le=1024**3)
    output_max_files: int = Field(default=defaults.OUTPUT_MAX_FILES, gt=0, le=100_000)
    artifact_total_bytes: int = Field(default=defaults.ARTIFACT_TOTAL_BYTES, ge=0, le=64 * 1024**3, description=(
        "What the run's artifacts (save_as_artifacts) may hold together, each file at its full size; a file past "
        "it is refused (skipped_files)."))


class InputFile(BaseModel):
    """A file placed in ``work/inputs/<name>`` before the command runs.

    Either ``content`` (bytes; base64 in JSON) or ``host_path``. A host path is read only when the caller
    that executes the request allows host paths (the CLI does; a model-driven tool call does not).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Destination relative to work/inputs.")
    content: Base64Bytes | None = None
    host_path: str | None = None


class RunRequest(BaseModel):
    """One command to run in a workspace with a staged skill."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    skill: SkillRef
    command: str = Field(min_length=1)
    cwd: str | None = Field(default=None, description="Working directory inside the workspace; default the skill folder.")
    env: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=defaults.RUN_TIMEOUT_SECONDS, gt=0, le=defaults.MAX_RUN_TIMEOUT_SECONDS)
    output_files: list[str] = Field(default_factory=list, description="Globs of files to collect after the run.")
    inputs: list[InputFile] = Field(default_factory=list)
    runtime: RuntimeName = RuntimeName.LOCAL
    limits: RunLimits = Field(default_factory=RunLimits)
    save_as_artifacts: bool = False
    omit_inline_content: bool = False
    network: bool = Field(default=False, description="Ask for network access (container runtimes; where the operator allows it).")
    wait_for_environment: bool = Field(
        default=True,
        description="When the skill's dependency environment is not built yet: build it and wait (true), or fail at "
                    "once saying so (false).",
    )
    workspace_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    secrets: list[str] = Field(
        default_factory=list, max_length=32,
        description="Names of the team's secrets to give the command as environment variables; each must be declared "
                    "by the skill (metadata.secrets). Their values never appear in the run's output.",
    )
    egress: list[str] = Field(
        default_factory=list, max_length=MAX_ENTRIES,
        description="The hosts the command may reach through the worker's egress proxy (host or *.domain, :port; "
                    "443 unless given), its only way out. Set by the control plane, never by an API caller: the "
                    "entries both the skill declares (metadata.egress) and the run's team allows. Empty: no network.",
    )
    keep_workspace: bool = Field(
        default=True,
        description="Keep the workspace once the run's result is stored (default: kept when the caller named a "
                    "workspace_id, removed — folder, user id, spawner, container — when the id was made for this run).",
    )

    _secret_values: dict[str, str] = PrivateAttr(default_factory=dict)
    """The values of ``secrets``, put here by whoever executes the run just before it runs (``worker.secrets.store``);
    never serialized, so never in a record, a job or a log."""

    _redacted_values: dict[str, str] = PrivateAttr(default_factory=dict)
    """Every secret value of the run's team, which what the run gives back is redacted of (set with the above)."""

    @property
    def secret_values(self) -> dict[str, str]:
        return self._secret_values

    @property
    def redacted_values(self) -> dict[str, str]:
        return self._redacted_values

    @model_validator(mode="before")
    @classmethod
    def _one_off_workspace(cls, data: object) -> object:
        """A request without a workspace id gets a workspace of its own, removed after the run unless asked to keep."""
        if isinstance(data, dict) and "keep_workspace" not in data:
            return {**data, "keep_workspace": data.get("workspace_id") is not None}
        return data

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, names: list[str]) -> list[str]:
        for name in names:
            problem = env_name_problem(name)
            if problem is not None:
                raise ValueError(f"secret name: {problem}")
        if len(set(names)) != len(names):
            raise ValueError("a secret is named twice")
        return names

    @field_validator("egress")
    @classmethod
    def _egress_entries(cls, entries: list[str]) -> list[str]:
        return [str(entry) for entry in parse_entries(entries, "a run's egress allow-list")]

    @model_validator(mode="after")
    def _egress_alone(self) -> RunRequest:
        if self.egress and self.network:
            raise ValueError("a run with an egress allow-list reaches those hosts alone: it cannot ask for network too")
        return self

    @field_validator("workspace_id")
    @classmethod
    def _valid_workspace_id(cls, value: str) -> str:
        if not WORKSPACE_ID_PATTERN.fullmatch(value):
            raise ValueError("workspace id must be 1-64 characters of letters, digits, '.', '_' or '-'")
        return value


class OutputFile(BaseModel):
    """A collected output file. ``content`` is text (a file of a text type whose bytes are UTF-8), base64
    (``encoding == "base64"``: any other file, its bytes as they are) or omitted (``"none"``)."""

    name: str
    content: str = ""
    mime_type: str
    size: int
    truncated: bool = False
    encoding: str = "utf-8"


class ArtifactFile(BaseModel):
    """An output file stored in the artifact store."""

    name: str
    version: int
    mime_type: str
    size: int
    sha256: str


class SkippedFile(BaseModel):
    """A path an output glob matched that was refused, and why."""

    name: str
    reason: str


class EgressRefusal(BaseModel):
    """A connection a run's egress proxy refused: where to (``host:port`` as the request named it, or ``(malformed
    request)``; never a path, a query or a header) and why."""

    destination: str
    reason: str


class RunTimings(BaseModel):
    """Milliseconds spent in each phase of a run."""

    queue_ms: float = 0.0
    stage_ms: float = 0.0
    exec_ms: float = 0.0
    collect_ms: float = 0.0
    redact_ms: float = Field(default=0.0, description="Taking the team's secrets out of what the run gave back "
                                                      "(counted in total_ms).")
    total_ms: float = 0.0
    exec_via: str = Field(
        default="", max_length=1000,
        description="How the command reached its sandbox where the runtime has more than one way: on Docker, "
                    "'executor' (the container's own executor) or 'docker exec' (with the reason the executor "
                    "was not used).",
    )


class RunResult(BaseModel):
    """What a run produced."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int
    timed_out: bool = False
    duration_ms: int = 0
    output_files: list[OutputFile] = Field(default_factory=list)
    artifact_files: list[ArtifactFile] = Field(default_factory=list)
    run_id: str
    workspace_id: str
    runtime: RuntimeName
    worker_id: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    skipped_files: list[SkippedFile] = Field(default_factory=list)
    oom_killed: bool = False
    timings: RunTimings = Field(default_factory=RunTimings)
    egress_refused: int = Field(default=0, description="Connections the run's egress proxy refused (all counted).")
    egress_refusals: list[EgressRefusal] = Field(
        default_factory=list, description="The first refused connections (at most 50): destination and reason.")

    def tool_result(self) -> dict:
        """The guide's ``WorkspaceRunResult`` shape, as the ``skill_run`` tool returns it to a model."""
        return self.model_dump(
            mode="json",
            include={"stdout", "stderr", "exit_code", "timed_out", "duration_ms", "output_files", "artifact_files"},
        )
