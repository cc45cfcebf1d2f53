"""The stores both planes share: run records (what happened to each submitted run, shared by whoever submits,
executes and watches it), the kept workspaces, and the one store of JSON documents.

* ``records`` — the record, its statuses and events;
* ``base`` — the store's contract and changes of state, and ``MemoryRunStore`` (the embedded default);
* ``redis_store`` — ``RedisRunStore`` (API processes and queue workers) and its key layout;
* ``fencing`` — the attempt a worker holds, which every change it makes must show;
* ``watch`` — waiting for runs on async I/O (the API's side);
* ``workspaces`` — the registry of kept workspaces (owner, runtime, created, last used, runs in them);
* ``documents`` — JSON documents by kind and id, in Redis or files: the control plane's registries, the secrets.
"""

from worker.run_store.base import ArtifactRoomRefusedError, BaseRunStore, MemoryRunStore
from worker.run_store.documents import BaseDocuments, FileDocuments, RedisDocuments
from worker.run_store.fencing import Attempt
from worker.run_store.records import (
    DURATION_BUCKETS_SECONDS,
    ENDING_EVENTS,
    Mutation,
    RunEvent,
    RunRecord,
    RunStatus,
    duration_bucket,
)
from worker.run_store.redis_store import RedisRunStore, RunKeys
from worker.run_store.watch import AsyncRunReader, RunWaiters
from worker.run_store.workspaces import (
    MemoryWorkspaces,
    RedisWorkspaces,
    WorkspaceEntry,
    WorkspaceKeys,
    WorkspaceRefusedError,
    joining,
)

__all__ = [
    "DURATION_BUCKETS_SECONDS",
    "ENDING_EVENTS",
    "ArtifactRoomRefusedError",
    "AsyncRunReader",
    "Attempt",
    "BaseDocuments",
    "BaseRunStore",
    "FileDocuments",
    "MemoryRunStore",
    "MemoryWorkspaces",
    "Mutation",
    "RedisDocuments",
    "RedisRunStore",
    "RedisWorkspaces",
    "RunEvent",
    "RunKeys",
    "RunRecord",
    "RunStatus",
    "RunWaiters",
    "WorkspaceEntry",
    "WorkspaceKeys",
    "WorkspaceRefusedError",
    "duration_bucket",
    "joining",
]
