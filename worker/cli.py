"""Command-line arguments of ``skillrun worker`` / ``python -m worker`` (kept free of heavy imports, so the
``skillrun`` command line starts fast; the consumer itself is ``worker.jobs.consumer``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from worker.names import RuntimeName

if TYPE_CHECKING:
    from pydantic import ValidationError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runtime", choices=[r.value for r in RuntimeName], default="local",
                        help="which queue to consume: runs for this runtime (default local)")
    parser.add_argument("--concurrency", type=int, default=1, metavar="N", help="worker processes to run (default 1)")
    parser.add_argument("--burst", action="store_true", help="exit once the queue is empty")
    parser.add_argument("--redis-url", metavar="URL", help="default $SKILLRUN_REDIS_URL")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker", description="Execute queued skill runs.")
    add_arguments(parser)
    return parser


def error_lines(exc: ValidationError, what: str) -> list[str]:
    """One line per error of ``exc``: where (``what`` when it names no field), then the message."""
    return [f"{'.'.join(str(part) for part in err['loc']) or what}: {err['msg']}" for err in exc.errors()]
