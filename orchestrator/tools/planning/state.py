"""One JSON blob per agent branch in session state: what the todo, task and goal tools keep.

The key is ``<prefix>:<branch>`` (the branch is the agent's name, so a parent and a sub-agent keep separate
blobs). A tool writes the blob through ``tool_context.state``, so it lands in the session with the tool's result
event and survives the process with a file or Redis session service. Tool calls of one model answer run
concurrently, each with its own state delta; so that a call sees what an earlier call of the same answer wrote,
the latest value is also kept for the rest of the invocation in its ``temp:`` state, and ``blob_lock`` serialises
the load → change → save of one blob.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from orchestrator.context import InvocationContext

_LATEST = "temp:session_blob:"
_locks: weakref.WeakValueDictionary[tuple[str, ...], asyncio.Lock] = weakref.WeakValueDictionary()


def state_key(prefix: str, branch: str) -> str:
    """``prefix`` with ``:<branch>`` appended (the bare prefix without a branch)."""
    return f"{prefix}:{branch}" if branch else prefix


def branch_of(ctx: InvocationContext) -> str:
    """The branch a tool call belongs to: its agent's name."""
    return getattr(ctx.agent, "name", "") or ""


def load_blob(ctx: InvocationContext, key: str) -> Any:
    """The current value under ``key`` (``None`` when unset), including writes of sibling calls."""
    latest = ctx.temp_state.get(_LATEST + key)
    if latest is not None:
        return latest
    return ctx.state.get(key)


def save_blob(ctx: InvocationContext, key: str, value: Any) -> None:
    """Record ``value`` under ``key`` in the call's state delta and for the rest of the invocation."""
    ctx.state[key] = value
    ctx.temp_state[_LATEST + key] = value


def blob_lock(ctx: InvocationContext, key: str) -> asyncio.Lock:
    """The lock of one blob of one session (shared by every tool that uses ``key``)."""
    ident = (ctx.app_name, ctx.user_id, ctx.session.id, key)
    lock = _locks.get(ident)
    if lock is None:
        lock = _locks[ident] = asyncio.Lock()
    return lock
