"""``skillrun serve``: the HTTP API under uvicorn."""

from __future__ import annotations

import argparse

import uvicorn

from orchestrator.api import create_app
from orchestrator.config import get_settings


def serve(args: argparse.Namespace) -> int:
    uvicorn.run(create_app(get_settings()), host=args.host, port=args.port, log_level="info")
    return 0
