"""``skillrun serve``: the HTTP API under uvicorn."""

from __future__ import annotations

import argparse

import uvicorn

from orchestrator.api import create_app
from orchestrator.config import get_settings

SHUTDOWN_GRACE_SECONDS = 5
"""On SIGTERM, how long requests still under way may go on: run waits and run event streams answer at once (the
app's own signal hook); an agent turn streaming its answer is given this long, then its connection is closed (the
session keeps the events stored so far)."""


def serve(args: argparse.Namespace) -> int:
    uvicorn.run(create_app(get_settings()), host=args.host, port=args.port, log_level="info",
                timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS)
    return 0
