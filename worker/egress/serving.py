"""A proxy served for the length of one build step or run, and gone after: to the sandboxes a task starts
(``serving_sandbox``: the local runtime, a listener placed on each one's loopback) or on a unix socket in a folder a
container mounts (``serving_folder``: the Docker runtime, behind the relay of ``worker.egress.relay``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from worker.egress.policy import AllowList
from worker.egress.proxy import EgressProxy
from worker.egress.relay import listen_in_folder
from worker.sandbox.bubblewrap import served_by


@contextlib.asynccontextmanager
async def serving_sandbox(allowed: AllowList, uid: int) -> AsyncIterator[EgressProxy]:
    """A proxy for ``allowed`` serving each served sandbox (``SandboxSpec.served``) of the user ``uid`` this task
    starts meanwhile, before anything of it runs (``served_by``); closed, with every connection, at the end."""
    proxy = EgressProxy(allowed)
    try:
        with served_by(functools.partial(proxy.serve_sandbox, uid)):
            yield proxy
    finally:
        await proxy.close()


@contextlib.asynccontextmanager
async def serving_folder(allowed: AllowList, folder: Path, uid: int | None) -> AsyncIterator[tuple[EgressProxy, str]]:
    """A proxy for ``allowed`` listening on a unix socket in ``folder`` that ``uid`` may connect to, and the
    socket's name there; closed, and the socket removed, at the end."""
    proxy = EgressProxy(allowed)
    name = f".skillrun-egress-{secrets.token_hex(6)}.sock"
    try:
        proxy.serve(await asyncio.to_thread(listen_in_folder, folder, name, uid))
        yield proxy, name
    finally:
        await proxy.close()
        with contextlib.suppress(OSError):
            os.unlink(folder / name)


__all__ = ["serving_folder", "serving_sandbox"]
