"""The registry of kept workspaces: which exist, whose (a team), on which runtime, created and last used when, and
which runs are in them now.

A run that keeps its workspace (a named ``workspace_id``, ``keep_workspace``) *claims* it when it is accepted — the
entry is made on its first run; refused past its owner's limit, while it is being removed, or on another runtime
than its own — and *releases* it when it ends, which is its last use. Whoever removes a workspace (idle removal,
``DELETE /v1/workspaces/{id}``, a deleted session) first *marks* it removing, which is refused while a run is in it
and refuses new runs meanwhile; a worker of its runtime removes it, and the entry is *forgotten*.

A workspace's owner is its run's owner; a run without one (an agent session's tool) gives its workspace to the
scope its id names, ``<scope>.<name>`` (the API names every workspace ``<team>.<id>``).

Entries live where the run records live: ``MemoryWorkspaces`` in the embedded default's process, ``RedisWorkspaces``
in Redis — one hash per workspace (``skillrun:workspace:id:<id>``: the entry, and a ``run:<run id>`` field per run in
it), the index of every entry by the time it is next looked at for idleness (``skillrun:workspace:idle``: its last
use; during a removal, when to try again) and one per owner by creation (``skillrun:workspace:owner:<owner>``). All
three go with the workspace, so the registry holds what exists and no more.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import redis
from pydantic import BaseModel, Field

from worker.contract import RunRequest, RuntimeName
from worker.errors import WorkerError

SCOPE = re.compile(r"^([a-z0-9][a-z0-9-]{0,31})\.")
REMOVAL_RETRY_SECONDS = 300.0
"""How long a workspace marked removing waits for its removal before idle removal asks a worker again."""


class WorkspaceRefusedError(WorkerError):
    """A kept workspace cannot be used or removed now; the message says why and what to do."""


class WorkspaceEntry(BaseModel):
    id: str
    owner: str | None = None
    runtime: RuntimeName
    created_at: float
    last_used_at: float
    state: Literal["kept", "removing"] = "kept"
    runs: list[str] = Field(default_factory=list, description="Runs queued or running in it.")
    node: str | None = Field(default=None, description="The node (work root) it lives on, once placed (queue mode).")


def workspace_owner(request: RunRequest, owner: str | None) -> str | None:
    """Whose a kept workspace is: the run's owner, else the scope its id names (``<scope>.<name>``)."""
    if owner is not None:
        return owner
    match = SCOPE.match(request.workspace_id)
    return match.group(1) if match else None


def joining(registry: MemoryWorkspaces | RedisWorkspaces, request: RunRequest) -> RunRequest:
    """``request`` as the run of a kept workspace it names: whatever its ``keep_workspace``, a run in a kept
    workspace is one of its runs (claimed, so neither a removal nor the limit overlooks it) and its end never
    removes the workspace under the others'."""
    if request.keep_workspace or registry.get(request.workspace_id) is None:
        return request
    return request.model_copy(update={"keep_workspace": True})


def limit_message(owner: str, limit: int) -> str:
    return (f"{owner} keeps {limit} workspaces, its limit (SKILLRUN_MAX_WORKSPACES_PER_TEAM); remove one "
            "(DELETE /v1/workspaces/{id}, skillrun workspaces rm ID) or run without a workspace_id")


def refusal(reason: str, request: RunRequest, owner: str | None, limit: int | None) -> WorkspaceRefusedError:
    """The error of a refused claim (``reason``: what the registry said)."""
    workspace_id = request.workspace_id
    if reason == "limit":
        return WorkspaceRefusedError(limit_message(owner or "", limit or 0))
    if reason == "removing":
        return WorkspaceRefusedError(f"workspace {workspace_id!r} is being removed; submit again once it is gone, "
                                     "or use another workspace_id")
    if reason.startswith("runtime:"):
        return WorkspaceRefusedError(f"workspace {workspace_id!r} lives on the {reason[8:]} runtime; run it there, "
                                     "or use another workspace_id for the " f"{request.runtime.value} runtime")
    return WorkspaceRefusedError(f"workspace {workspace_id!r} belongs to someone else; use another workspace_id")


def busy_message(workspace_id: str, runs: list[str]) -> str:
    return (f"workspace {workspace_id!r} has runs queued or running ({', '.join(sorted(runs))}); wait for them to "
            "end or cancel them (POST /v1/runs/{id}/cancel), then remove it again")


class MemoryWorkspaces:
    """The registry in this process (the embedded default)."""

    def __init__(self, *, limit: int | None = None, clock: Callable[[], float] = time.time) -> None:
        self.limit = limit
        self.clock = clock
        self._entries: dict[str, WorkspaceEntry] = {}
        self._retry_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def claim(self, request: RunRequest, owner: str | None, node: str | None = None, limit: int | None = None) -> None:
        """Note a run accepted into its kept workspace (made on first use, placed on ``node`` when it has no node
        yet); ``WorkspaceRefusedError`` when it may not be. ``limit``: the owner's own limit of workspaces."""
        owner = workspace_owner(request, owner)
        limit = self.limit if limit is None else limit
        now = self.clock()
        with self._lock:
            entry = self._entries.get(request.workspace_id)
            if entry is None:
                kept = sum(1 for e in self._entries.values() if e.owner == owner)
                if owner is not None and limit and kept >= limit:
                    raise refusal("limit", request, owner, limit)
                entry = self._entries[request.workspace_id] = WorkspaceEntry(
                    id=request.workspace_id, owner=owner, runtime=request.runtime, created_at=now, last_used_at=now)
            elif entry.state == "removing":
                raise refusal("removing", request, owner, self.limit)
            elif entry.owner != owner:
                raise refusal("owner", request, owner, self.limit)
            elif entry.runtime != request.runtime:
                raise refusal(f"runtime:{entry.runtime.value}", request, owner, self.limit)
            entry.runs.append(request.run_id)
            entry.last_used_at = now
            entry.node = entry.node or node

    def join(self, request: RunRequest, owner: str | None) -> bool:
        """``claim``, for an existing kept workspace alone; ``False`` (nothing noted) where there is none, or where
        ``claim`` would refuse."""
        with self._lock:
            entry = self._entries.get(request.workspace_id)
            if entry is None or entry.state != "kept" or entry.owner != workspace_owner(request, owner) or \
                    entry.runtime != request.runtime:
                return False
            entry.runs.append(request.run_id)
            entry.last_used_at = self.clock()
            return True

    def release(self, workspace_id: str, run_id: str) -> None:
        """A run in the workspace ended: its last use."""
        with self._lock:
            entry = self._entries.get(workspace_id)
            if entry is not None and run_id in entry.runs:
                entry.runs.remove(run_id)
                entry.last_used_at = self.clock()

    def get(self, workspace_id: str) -> WorkspaceEntry | None:
        with self._lock:
            entry = self._entries.get(workspace_id)
            return entry.model_copy(deep=True) if entry else None

    def list(self, owner: str, offset: int = 0, limit: int = 100) -> tuple[list[WorkspaceEntry], int]:
        """``owner``'s workspaces, oldest first, from ``offset``; and how many it has."""
        with self._lock:
            mine = sorted((e for e in self._entries.values() if e.owner == owner), key=lambda e: (e.created_at, e.id))
            return [e.model_copy(deep=True) for e in mine[offset:offset + limit]], len(mine)

    def idle(self, before: float, limit: int) -> list[str]:
        """Up to ``limit`` workspaces last used before ``before`` (or whose removal is due again)."""
        with self._lock:
            due = [(self._retry_at.get(e.id, e.last_used_at), e.id) for e in self._entries.values() if not e.runs]
            return [workspace_id for at, workspace_id in sorted(due) if at < before][:limit]

    def mark_removing(self, workspace_id: str, idle_before: float | None = None) -> WorkspaceEntry | None:
        """Mark the workspace removing (new runs are refused) and return it; ``None`` when there is no such
        workspace, or it was used since ``idle_before``. ``WorkspaceRefusedError`` while runs are in it."""
        with self._lock:
            entry = self._entries.get(workspace_id)
            if entry is None:
                return None
            if entry.runs:
                raise WorkspaceRefusedError(busy_message(workspace_id, entry.runs))
            if idle_before is not None and entry.state == "kept" and entry.last_used_at >= idle_before:
                return None
            entry.state = "removing"
            self._retry_at[workspace_id] = self.clock() + REMOVAL_RETRY_SECONDS
            return entry.model_copy(deep=True)

    def forget(self, workspace_id: str) -> None:
        """The workspace was removed: its entry goes."""
        with self._lock:
            self._entries.pop(workspace_id, None)
            self._retry_at.pop(workspace_id, None)


@dataclass(frozen=True)
class WorkspaceKeys:
    """Where the registry keeps things in Redis."""

    prefix: str = "skillrun:workspace"

    def entry(self, workspace_id: str) -> str:
        return f"{self.prefix}:id:{workspace_id}"  # a namespace of its own: a workspace may be called "idle"

    @property
    def idle(self) -> str:
        return f"{self.prefix}:idle"

    def owner(self, owner: str) -> str:
        return f"{self.prefix}:owner:{owner}"


CLAIM = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
    if ARGV[2] ~= '' and tonumber(ARGV[6]) > 0 and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[6]) then
        return 'limit'
    end
    redis.call('HSET', KEYS[1], 'id', ARGV[1], 'owner', ARGV[2], 'runtime', ARGV[3], 'created_at', ARGV[4],
               'state', 'kept')
    if ARGV[2] ~= '' then
        redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
    end
elseif state == 'removing' then
    return 'removing'
else
    local held = redis.call('HMGET', KEYS[1], 'owner', 'runtime')
    if held[1] ~= ARGV[2] then
        return 'owner'
    end
    if held[2] ~= ARGV[3] then
        return 'runtime:' .. held[2]
    end
end
redis.call('HSET', KEYS[1], 'last_used_at', ARGV[4], 'run:' .. ARGV[5], '1')
if ARGV[7] ~= '' then
    redis.call('HSETNX', KEYS[1], 'node', ARGV[7])
end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
return 'ok'
"""
"""``KEYS = [entry, owner index, idle index]``, ``ARGV = [id, owner or '', runtime, now, run id, limit or 0, node or
'']``."""

PLACE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
    return false
end
redis.call('HSETNX', KEYS[1], 'node', ARGV[1])
return redis.call('HGET', KEYS[1], 'node')
"""
"""``KEYS = [entry]``, ``ARGV = [node]``: the workspace's node, this one if it had none; nil when it is gone."""

RELEASE = """
if redis.call('HDEL', KEYS[1], 'run:' .. ARGV[2]) == 1 then
    redis.call('HSET', KEYS[1], 'last_used_at', ARGV[3])
    redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
end
return 0
"""
"""``KEYS = [entry, idle index]``, ``ARGV = [id, run id, now]``: never makes an entry that is gone."""

UNCLAIM = """
if redis.call('HDEL', KEYS[1], 'run:' .. ARGV[2]) == 0 then
    return 0
end
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, 4) == 'run:' then
        return 0
    end
end
local created, used, owner = unpack(redis.call('HMGET', KEYS[1], 'created_at', 'last_used_at', 'owner'))
if created ~= used then
    return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if owner and owner ~= '' then
    redis.call('ZREM', ARGV[3] .. owner, ARGV[1])
end
return 1
"""
"""``KEYS = [entry, idle index]``, ``ARGV = [id, run id, owner index prefix]``: takes back a claim of a run never
announced (refused after its claim: a quota); a workspace that claim made, used by no run since, goes with it."""

MARK_REMOVING = """
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {'gone'}
end
local busy = {'busy'}
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, 4) == 'run:' then
        local run_id = string.sub(field, 5)
        if redis.call('EXISTS', ARGV[3] .. run_id) == 1 then
            table.insert(busy, run_id)
        else
            redis.call('HDEL', KEYS[1], field)
        end
    end
end
if #busy > 1 then
    redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
    return busy
end
local state, used = unpack(redis.call('HMGET', KEYS[1], 'state', 'last_used_at'))
if ARGV[4] ~= '' and state == 'kept' and tonumber(used) >= tonumber(ARGV[4]) then
    return {'used'}
end
redis.call('HSET', KEYS[1], 'state', 'removing')
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
return {'removing'}
"""
"""``KEYS = [entry, idle index]``, ``ARGV = [id, now, run record prefix, idle before or '', retry at]``. Runs whose
record is gone (never announced, or lost with Redis's data) no longer hold the workspace."""

FORGET = """
local owner = redis.call('HGET', KEYS[1], 'owner')
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if owner and owner ~= '' then
    redis.call('ZREM', ARGV[2] .. owner, ARGV[1])
end
return 0
"""
"""``KEYS = [entry, idle index]``, ``ARGV = [id, owner index prefix]``."""


class RedisWorkspaces:
    """The registry in Redis (see the module's key layout), next to the run records whose prefix it is given."""

    def __init__(self, connection: redis.Redis, records: str, *, keys: WorkspaceKeys | None = None,
                 limit: int | None = None, clock: Callable[[], float] = time.time) -> None:
        """``records``: the prefix of run records (``<records><run id>``), to tell runs that are gone."""
        self.redis = connection
        self.records = records
        self.keys = keys or WorkspaceKeys()
        self.limit = limit
        self.clock = clock
        self._claim = connection.register_script(CLAIM)
        self._release = connection.register_script(RELEASE)
        self._unclaim = connection.register_script(UNCLAIM)
        self._mark = connection.register_script(MARK_REMOVING)
        self._forget = connection.register_script(FORGET)
        self._place = connection.register_script(PLACE)

    def claim(self, request: RunRequest, owner: str | None, node: str | None = None, limit: int | None = None) -> None:
        """``limit``: the owner's own limit of workspaces, instead of the registry's."""
        owner = workspace_owner(request, owner)
        limit = self.limit if limit is None else limit
        keys = [self.keys.entry(request.workspace_id), self.keys.owner(owner or ""), self.keys.idle]
        args = [request.workspace_id, owner or "", request.runtime.value, self.clock(), request.run_id, limit or 0,
                node or ""]
        said = self._claim(keys=keys, args=args).decode()
        if said != "ok":
            raise refusal(said, request, owner, limit)

    def release(self, pipe: redis.client.Pipeline, workspace_id: str, run_id: str) -> None:
        """In ``pipe`` (the transaction that ends the run)."""
        self._release(keys=[self.keys.entry(workspace_id), self.keys.idle], args=[workspace_id, run_id, self.clock()],
                      client=pipe)

    def unclaim(self, pipe: redis.client.Pipeline, workspace_id: str, run_id: str) -> None:
        """In ``pipe``: take back the claim of a run never announced; a workspace it made goes with it (else a
        refused run would leave a kept workspace counted against its owner's limit)."""
        self._unclaim(keys=[self.keys.entry(workspace_id), self.keys.idle],
                      args=[workspace_id, run_id, self.keys.owner("")], client=pipe)

    def get(self, workspace_id: str) -> WorkspaceEntry | None:
        return _entry(self.redis.hgetall(self.keys.entry(workspace_id)))

    def node(self, workspace_id: str) -> str | None:
        """The node the workspace lives on, if it was placed."""
        node = self.redis.hget(self.keys.entry(workspace_id), "node")
        return node.decode() if node else None

    def place(self, workspace_id: str, node: str) -> str | None:
        """Place the workspace on ``node`` unless it has a node; return its node (``None``: no such workspace)."""
        placed = self._place(keys=[self.keys.entry(workspace_id)], args=[node])
        return placed.decode() if placed else None

    def list(self, owner: str, offset: int = 0, limit: int = 100) -> tuple[list[WorkspaceEntry], int]:
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(self.keys.owner(owner))
            pipe.zrange(self.keys.owner(owner), offset, offset + limit - 1)
            total, ids = pipe.execute()
        with self.redis.pipeline(transaction=False) as pipe:
            for workspace_id in ids:
                pipe.hgetall(self.keys.entry(workspace_id.decode()))
            found = pipe.execute() if ids else []
        return [entry for entry in map(_entry, found) if entry is not None], total

    def idle(self, before: float, limit: int) -> list[str]:
        return [i.decode() for i in self.redis.zrangebyscore(self.keys.idle, "-inf", f"({before}", 0, limit)]

    def mark_removing(self, workspace_id: str, idle_before: float | None = None) -> WorkspaceEntry | None:
        now = self.clock()
        said = self._mark(keys=[self.keys.entry(workspace_id), self.keys.idle], args=[
            workspace_id, now, self.records, "" if idle_before is None else idle_before, now + REMOVAL_RETRY_SECONDS])
        outcome = said[0].decode()
        if outcome == "busy":
            raise WorkspaceRefusedError(busy_message(workspace_id, [run.decode() for run in said[1:]]))
        return self.get(workspace_id) if outcome == "removing" else None

    def forget(self, workspace_id: str) -> None:
        self._forget(keys=[self.keys.entry(workspace_id), self.keys.idle], args=[workspace_id, self.keys.owner("")])


def _entry(fields: dict[bytes, bytes]) -> WorkspaceEntry | None:
    if not fields:
        return None
    text = {key.decode(): value.decode() for key, value in fields.items()}
    return WorkspaceEntry(
        id=text["id"], owner=text["owner"] or None, runtime=RuntimeName(text["runtime"]),
        created_at=float(text["created_at"]), last_used_at=float(text.get("last_used_at", text["created_at"])),
        state=text["state"], runs=sorted(key[4:] for key in text if key.startswith("run:")), node=text.get("node"),
    )
