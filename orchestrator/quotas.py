"""Team quotas: how many runs a team may have queued and running, the most each of its runs may ask for, and how many
workspaces it keeps.

A quota is stored per team (``skillrun teams set-quota``) over the operator's defaults (``SKILLRUN_TEAM_MAX_*``);
a field the team's quota leaves unset takes the default. The dispatcher checks a submission against its team's
quota before anything of it is stored (``QuotaExceededError``: HTTP 429, with what was exceeded and when to try
again), and counts queued runs atomically with the submission, so a team at its quota that submits a hundred runs
at once gets exactly as many in as it has room for. Past ``max_running`` a team's runs are not refused: they wait
their turn in its line (``worker.jobs.fair_queue``).

Builds of skills' dependency environments count too, in a field of their own (``max_builds``): the builds a team's
library registrations start — one per library version and runtime, queued or under way — are counted in the same
step that starts them (``orchestrator.builds``); a registration that would pass the quota is refused
(429), nothing of it registered or started, and a build that ends (finished, failed, cancelled, its worker lost)
frees its place. Builds and runs do not share places: a build goes to its runtime's builders
(``skillrun:<runtime>:environments``), never through the team's line of runs, and what a run builds for itself
(when it waits for its environment) is part of that run, within its time and quota.

Stored artifacts count against ``max_artifact_bytes``: what the artifacts of the team's ended runs keep (within
their retention) and what its runs going hold. A run saving artifacts is given the room left when it is accepted, in
the step that stores it (the run store's ``hold_artifact_room``: under the store's lock, or in the Redis transaction
that announces and enqueues it): its ``limits.artifact_total_bytes`` is lowered to that room and held for it until
it ends, however it ends, when what it stored is tallied instead; with no room left it is refused (429). So a team
that submits many such runs at once keeps and holds no more than its quota.

Quotas are read through a short cache (``CACHE_SECONDS``): a changed quota holds within that time in every API
process.
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.errors import DispatchError
from worker import defaults

if TYPE_CHECKING:  # the command line builds its options from TeamQuota: nothing heavier is imported
    from orchestrator.documents import BaseDocuments
    from worker.contract import RunRequest

CACHE_SECONDS = 5.0
KIND = "quotas"
MAX_BUILDS_CEILING = 10_000
MAX_ARTIFACT_BYTES_CEILING = 1024**5
ARTIFACT_RETRY_AFTER_SECONDS = 3600
"""What a team refused for its stored artifacts is told to wait: they are tallied by the hour their runs ended (room
held by its runs going comes back sooner, as they end)."""
BUILD_RETRY_AFTER_SECONDS = 30
"""What a team refused a build is told to wait: a build takes minutes, and places free as builds end."""


class TeamQuota(BaseModel):
    """A team's quota. ``None`` takes the operator's default; a count of 0 means no limit."""

    model_config = ConfigDict(extra="forbid")

    max_running: int | None = Field(default=None, ge=0, le=100_000, description=(
        "Runs of the team started at once (0: no cap); more wait their turn."))
    max_queued: int | None = Field(default=None, ge=0, le=10_000_000, description=(
        "Runs of the team waiting to start (0: no limit); a submission past it is refused (429)."))
    max_timeout_seconds: float | None = Field(default=None, gt=0, le=defaults.MAX_RUN_TIMEOUT_SECONDS,
                                              allow_inf_nan=False, description="The most a run's `timeout` may be.")
    max_memory_bytes: int | None = Field(default=None, gt=0, le=64 * 1024**3,
                                         description="The most a run's `limits.memory_bytes` may be.")
    max_cpu_seconds: int | None = Field(default=None, gt=0, le=24 * 3600,
                                        description="The most a run's `limits.cpu_seconds` may be.")
    max_disk_bytes: int | None = Field(default=None, gt=0, le=64 * 1024**3, description=(
        "The most a run's `limits.file_size_bytes` (the largest file it may write) may be."))
    max_output_bytes: int | None = Field(default=None, ge=0, le=1024**3, description=(
        "The most each of a run's `limits.stdout_bytes`, `stderr_bytes` and `output_total_bytes` may be."))
    max_workspaces: int | None = Field(default=None, gt=0, le=100_000,
                                       description="Kept workspaces the team may have at once.")
    max_builds: int | None = Field(default=None, ge=0, le=MAX_BUILDS_CEILING, description=(
        "Dependency-environment builds of the team (one per library version and runtime) queued or under way at "
        "once (0: no limit); a registration that would start more is refused (429)."))
    max_artifact_bytes: int | None = Field(default=None, ge=0, le=MAX_ARTIFACT_BYTES_CEILING, description=(
        "Bytes of artifacts the team's runs keep at once, within the artifacts' retention, with what its runs going "
        "hold (0: no limit): a run saving artifacts is given what is left when it is accepted (its "
        "`limits.artifact_total_bytes` lowered to it), held until it ends, and is refused (429) when nothing is."))

    def over(self, defaults_: "TeamQuota") -> "TeamQuota":
        """This quota with its unset fields taken from ``defaults_``."""
        return defaults_.model_copy(update=self.model_dump(exclude_none=True))


class QuotaUsage(BaseModel):
    queued: int = Field(description="Runs of the team waiting to start.")
    running: int = Field(description="Runs of the team started and not ended.")
    workspaces: int = Field(description="Kept workspaces of the team.")
    builds: int = Field(description="Environment builds of the team queued or under way.")
    artifact_bytes: int = Field(description="Bytes of artifacts the team's runs keep (those of runs that ended "
                                            "within the artifacts' retention).")
    artifact_bytes_reserved: int = Field(description=(
        "Bytes of max_artifact_bytes held by the team's runs going that save artifacts (each its "
        "limits.artifact_total_bytes as accepted) until they end; the quota holds this and artifact_bytes together."))


class QuotaExceededError(DispatchError):
    """A submission over its team's quota: ``what`` names the quota; ``retry_after`` (seconds) when trying again
    may help (``None``: it will not, lower the request)."""

    def __init__(self, what: str, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.what = what
        self.retry_after = retry_after


CEILINGS: tuple[tuple[str, str], ...] = (
    ("max_timeout_seconds", "timeout"),
    ("max_memory_bytes", "limits.memory_bytes"),
    ("max_cpu_seconds", "limits.cpu_seconds"),
    ("max_disk_bytes", "limits.file_size_bytes"),
    ("max_output_bytes", "limits.stdout_bytes"),
    ("max_output_bytes", "limits.stderr_bytes"),
    ("max_output_bytes", "limits.output_total_bytes"),
)
"""Each ceiling of a quota and the request fields it caps."""


def apply_ceilings(quota: TeamQuota, request: RunRequest, team: str) -> None:
    """Hold ``request`` to the ceilings of ``quota``: a field left at its default is lowered to its ceiling (a team
    whose ceiling is under the default need not ask for less on every run); a field asked for above its ceiling is
    ``QuotaExceededError``, naming it."""
    for name, path in CEILINGS:
        ceiling = getattr(quota, name)
        if ceiling is None:
            continue
        *parents, field = path.split(".")
        holder = request
        for part in parents:
            holder = getattr(holder, part)
        value = getattr(holder, field)
        if value <= ceiling:
            continue
        if value == type(holder).model_fields[field].default:
            setattr(holder, field, type(value)(ceiling))
            continue
        raise QuotaExceededError(name, f"{path} is {shown(value)}, over team {team}'s quota {name} "
                                       f"({shown(ceiling)}): ask for at most {shown(ceiling)}")


def artifacts_refusal(team: str, limit: int, kept: int, reserved: int, retention_seconds: float) -> QuotaExceededError:
    """A run saving artifacts while ``team``'s ended runs keep ``kept`` bytes of them and its runs going hold
    ``reserved``, which leave nothing of its quota of ``limit``."""
    return QuotaExceededError("max_artifact_bytes", f"team {team} keeps {shown(kept)} bytes of artifacts and its runs "
                                                    f"going hold {shown(reserved)} more, its quota max_artifact_bytes "
                                                    f"({shown(limit)}): what is kept goes "
                                                    f"{shown(round(retention_seconds))} s after its runs ended, what "
                                                    "is held as its runs end; run without save_as_artifacts meanwhile",
                              ARTIFACT_RETRY_AFTER_SECONDS)


def shown(value: float) -> str:
    """A quota's number as written: a count of bytes in full (``:g`` alone rounds 536870913 to 5.36871e+08)."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def queued_refusal(team: str, limit: int, retry_after: float) -> QuotaExceededError:
    seconds = max(1, min(60, math.ceil(retry_after)))
    return QuotaExceededError("max_queued", f"team {team} has {limit} runs waiting to start, its quota max_queued: "
                                            f"try again in {seconds} s, when some have started", seconds)


def builds_refusal(team: str, limit: int, held: int, needed: int) -> QuotaExceededError:
    """A registration that would start ``needed`` builds while ``team`` holds ``held`` of its ``limit``."""
    if needed > limit:
        return QuotaExceededError("max_builds", f"this library version needs {needed} environment builds (one per "
                                                f"runtime), more than team {team}'s quota max_builds ({limit}) allows "
                                                "at once: the operator can raise it")
    return QuotaExceededError("max_builds", f"team {team} has {held} environment builds queued or under way and this "
                                            f"library version needs {needed} more, past its quota max_builds "
                                            f"({limit}): try again in {BUILD_RETRY_AFTER_SECONDS} s, when one has "
                                            "ended (a run that waits for its environment builds it within the run)",
                              BUILD_RETRY_AFTER_SECONDS)


class Quotas:
    """The teams' quotas in ``documents`` over the operator's ``defaults``."""

    def __init__(self, documents: BaseDocuments, defaults_: TeamQuota) -> None:
        self.docs = documents
        self.defaults = defaults_
        self._cache: dict[str, tuple[float, TeamQuota]] = {}
        self._lock = threading.Lock()

    def stored(self, team: str) -> TeamQuota:
        """What the team's own quota sets (unset fields ``None``)."""
        doc = self.docs.get(KIND, team)
        return TeamQuota.model_validate(doc) if doc else TeamQuota()

    def cached(self, team: str) -> TeamQuota | None:
        """The team's quota if the cache holds it (no I/O), else ``None``."""
        with self._lock:
            cached = self._cache.get(team)
        return cached[1] if cached is not None and cached[0] > time.monotonic() else None

    def of(self, team: str) -> TeamQuota:
        """The quota that holds for ``team`` (its own over the defaults), cached ``CACHE_SECONDS``."""
        now = time.monotonic()
        quota = self.cached(team)
        if quota is not None:
            return quota
        quota = self.stored(team).over(self.defaults)
        with self._lock:
            if len(self._cache) > 10_000:  # teams come and go: the cache stays bounded
                self._cache.clear()
            self._cache[team] = (now + CACHE_SECONDS, quota)
        return quota

    def set(self, team: str, changes: dict[str, object]) -> TeamQuota:
        """Change fields of the team's own quota (a value of ``None`` goes back to the default); its new quota.
        A bad value raises pydantic's ``ValidationError`` and stores nothing."""
        quota = TeamQuota.model_validate({**self.stored(team).model_dump(exclude_none=True), **changes})
        self.docs.put(KIND, team, quota.model_dump(exclude_none=True))
        with self._lock:
            self._cache.pop(team, None)
        return quota
