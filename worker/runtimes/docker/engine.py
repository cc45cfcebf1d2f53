"""The Docker engine in the worker's terms: its errors translated in one place, its times read.

Every call the Docker runtime makes (workspace containers, build containers, derived images) goes through
``map_docker_errors``, so a missing image, a refusal or an engine that does not answer reaches the caller as a
``RuntimeUnavailableError`` carrying the engine's own reason and what to do about it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime

import docker.errors
import requests.exceptions

from worker.errors import RuntimeUnavailableError

ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)
"""What a call to the engine may raise: the SDK's errors, and the transport's when the engine's socket is gone (an
engine restarting) — the SDK does not always wrap those."""


@contextlib.contextmanager
def map_docker_errors(action: str) -> Iterator[None]:
    """Docker SDK errors → ``RuntimeUnavailableError`` with the engine's own reason."""
    try:
        yield
    except docker.errors.ImageNotFound as exc:
        raise RuntimeUnavailableError(f"{action}: image not found ({exc.explanation}); build it with images/build.sh") from exc
    except docker.errors.APIError as exc:
        reason = str(exc.explanation or exc)
        if "unknown runtime" in reason.lower():
            raise RuntimeUnavailableError(
                f"{action}: the Docker engine has no such OCI runtime ({reason}): set SKILLRUN_DOCKER_OCI_RUNTIME "
                "(the runtime's oci_runtime) to one the engine lists in `docker info` (runc, or runsc once gVisor is "
                "registered)") from exc
        raise RuntimeUnavailableError(f"{action}: the Docker engine refused: {reason}") from exc
    except ENGINE_ERRORS as exc:
        raise RuntimeUnavailableError(f"{action}: no Docker engine answers ({exc}); start dockerd") from exc


def engine_time(text: str) -> float:
    """An engine's RFC 3339 UTC time (``2024-05-01T10:00:00.123456789Z``) in seconds since the epoch; 0 when
    there is none."""
    try:
        return datetime.fromisoformat(text[:26].rstrip("Z") + "+00:00").timestamp()
    except ValueError:
        return 0.0


__all__ = ["ENGINE_ERRORS", "engine_time", "map_docker_errors"]
