"""``skillrun serve``: the HTTP API under uvicorn."""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI

from orchestrator.api import create_app
from orchestrator.config import get_settings

SHUTDOWN_GRACE_SECONDS = 5
"""On SIGTERM, how long requests still under way may go on: run waits and run event streams answer at once (the
app's own signal hook); an agent turn streaming its answer is given this long, then its connection is closed (the
session keeps the events stored so far)."""
MAX_REQUEST_HEAD_BYTES = 256 * 1024
"""The largest request line and headers read. The longest the API's schema allows is a skill search of 10,000
characters, up to 120,000 bytes percent-encoded; past this uvicorn answers a bare 400 the schema cannot declare."""


def server_config(app: FastAPI, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    """How the API is served, by ``skillrun serve`` and by the tests alike."""
    # loop "auto": uvloop, a dependency
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, http="h11", loop="auto",
                          h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES,
                          timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS)


def serve(args: argparse.Namespace) -> int:
    uvicorn.Server(server_config(create_app(get_settings()), args.host, args.port)).run()
    return 0
