"""A team's runs for every front end (the API, the console): accept one, find one, follow its events, read its files
and artifacts. Refusals are the control plane's errors (``orchestrator.errors``); each front end answers them its own
way (the API's statuses are ``orchestrator.api.responses.refusal``)."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.builds import not_ready
from orchestrator.egress import EgressStore
from orchestrator.errors import (
    DispatchError,
    InvalidRunError,
    RunFileNotFoundError,
    RunLostError,
    RunNotFoundError,
    RunRefusedError,
    UnavailableError,
)
from orchestrator.quotas import QuotaExceededError
from orchestrator.schemas import RunCreate
from orchestrator.services.container import Services
from orchestrator.services.run_ids import lost, mint
from orchestrator.skills.admission import run_egress, undeclared_secrets
from orchestrator.skills.repository import BaseSkillRepository
from orchestrator.teams import Team
from worker.artifacts import ArtifactStream
from worker.contract import (
    ArtifactFile,
    InputFile,
    OutputFile,
    RunRequest,
    RuntimeName,
)
from worker.errors import (
    ArtifactError,
    BlobStoreError,
    EnvironmentNotReadyError,
    SecretError,
    WorkerError,
)
from worker.names import env_name_problem
from worker.run_store import ENDING_EVENTS, RunRecord
from worker.validation import validate_request

BUILT_AHEAD = (RuntimeName.LOCAL, RuntimeName.DOCKER)
"""Runtimes whose environments the control plane can see before a run (the Cube runtime's are built in each
sandbox)."""

BLOB_STORE_RETRY_AFTER_SECONDS = 5


async def accept_run(services: Services, team: Team, body: RunCreate) -> RunRecord:
    """Check and submit a team's run: its skill in the team's library, the secrets it names declared and stored, its
    environment ready unless it waits for it, its egress what its skill declares and its team allows, its fields
    within the contract and the team's quota (nothing of a refused run is stored)."""
    request = await asyncio.to_thread(_checked_request, services, team, body)  # reads the team's records: one thread
    try:
        return await services.dispatcher.submit(request, priority=body.priority, owner=team.id)
    except QuotaExceededError:
        raise
    except (ValueError, DispatchError, WorkerError) as exc:
        raise InvalidRunError(str(exc)) from exc


def _checked_request(services: Services, team: Team, body: RunCreate) -> RunRequest:
    """The request of a team's run, its skill, secrets, environment and egress checked against the team's records
    (its libraries read once)."""
    repository = services.repository_for(team)
    ref = repository.skill_ref(body.skill)
    if body.secrets:
        _check_secrets(services, repository, team, body.skill, body.secrets)
    if not body.wait_for_environment and body.runtime in BUILT_AHEAD:
        environment = services.environments.skill_status(ref, body.runtime.value)
        if environment.state not in ("ready", "none"):
            raise EnvironmentNotReadyError(not_ready(body.skill, environment))
    egress = run_egress(repository, body.skill, EgressStore(services.teams.docs).get(team.id).entries)
    fields = body.model_dump(exclude={"skill", "inputs", "priority", "workspace_id", "keep_workspace"})
    keep = body.workspace_id is not None if body.keep_workspace is None else body.keep_workspace
    try:
        request = RunRequest(
            skill=ref, inputs=[InputFile(name=i.name, content=i.content) for i in body.inputs],
            workspace_id=f"{team.id}.{body.workspace_id or uuid.uuid4().hex[:16]}", keep_workspace=keep,
            run_id=mint(team.id), egress=egress, **fields,
        )
        validate_request(request)
    except (ValueError, WorkerError) as exc:
        raise InvalidRunError(str(exc)) from exc
    return request


def _check_secrets(services: Services, repository: BaseSkillRepository, team: Team, skill: str,
                   names: list[str]) -> None:
    """A run may name only secrets its skill declares and the team has stored."""
    problems = [problem for name in names if (problem := env_name_problem(name)) is not None]
    if problems:
        raise InvalidRunError(f"secrets: {problems[0]}")
    undeclared = undeclared_secrets(repository, skill, names)
    if undeclared is not None:
        raise RunRefusedError(undeclared)
    if services.secrets is None:
        raise RunRefusedError("secrets are not set up on this server: its operator sets SKILLRUN_SECRETS_KEY")
    try:
        stored = {info.name for info in services.secrets.list(team.id)}
    except SecretError as exc:
        raise RunRefusedError(str(exc)) from exc
    missing = [name for name in names if name not in stored]
    if missing:
        raise RunRefusedError(f"the team has no secret {', '.join(missing)}: store it with PUT /v1/secrets/<name> or "
                              f"skillrun secrets set")


async def team_run(services: Services, run_id: str, team: Team) -> RunRecord:
    """The team's run ``run_id``: ``RunLostError`` for a run of the team whose record is gone, ``RunNotFoundError``
    for no such run or another team's."""
    record = await services.dispatcher.get(run_id)
    if record is None or record.owner != team.id:
        raise missing_run(services, run_id, team, record is None)
    return record


def missing_run(services: Services, run_id: str, team: Team, no_record: bool) -> RunLostError | RunNotFoundError:
    """What a run the team cannot read is: lost (its id is the team's and its record vanished) or not found."""
    if no_record and lost(run_id, team.id, services.dispatcher.result_ttl):
        return RunLostError(run_id)
    return RunNotFoundError(run_id)


@dataclass(frozen=True)
class Followed:
    """One item of a followed run: an event of the run, or how following ended (``closing``, ``lost``,
    ``unavailable``) with what it says."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)


async def follow_run(services: Services, run_id: str) -> AsyncIterator[Followed]:
    """A run's events until it ends; then ``closing`` when the process shuts down first, ``lost`` when the run's
    record vanished, ``unavailable`` when Redis went away (follow again after ``retry_after`` seconds)."""
    last = None
    try:
        async for event in services.dispatcher.follow(run_id):
            last = event.type
            yield Followed(event.type, event.model_dump())
    except RunLostError as exc:
        yield Followed("lost", {"reason": str(exc)})
        return
    except UnavailableError as exc:
        yield Followed("unavailable", {"reason": str(exc), "retry_after": exc.retry_after})
        return
    if last not in ENDING_EVENTS:
        yield Followed("closing", {"reason": "the API is shutting down; follow the run again"})


def output_file(record: RunRecord, name: str) -> tuple[OutputFile, bytes]:
    """Output file ``name`` of a run and its bytes."""
    found = next((f for f in (record.result.output_files if record.result else []) if f.name == name), None)
    if found is None:
        raise RunFileNotFoundError(f"run {record.id!r} has no output file {name!r}")
    if found.encoding == "none":
        raise RunFileNotFoundError(f"{name!r} was collected without content; save it as an artifact")
    return found, base64.b64decode(found.content) if found.encoding == "base64" else found.content.encode()


async def open_artifact(services: Services, record: RunRecord, name: str) -> tuple[ArtifactFile, ArtifactStream]:
    """Artifact ``name`` of a run, opened in the artifact store (``UnavailableError`` when the store cannot be
    reached)."""
    found = next((a for a in (record.result.artifact_files if record.result else []) if a.name == name), None)
    if found is None:
        raise RunFileNotFoundError(f"run {record.id!r} has no artifact {name!r}")
    try:
        opened = await asyncio.to_thread(services.artifact_store.open, record.request.workspace_id, name, found.version)
    except BlobStoreError as exc:
        raise UnavailableError(str(exc), BLOB_STORE_RETRY_AFTER_SECONDS) from exc
    except ArtifactError as exc:
        raise RunFileNotFoundError(str(exc)) from exc
    return found, opened
