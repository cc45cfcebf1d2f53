"""Dispatch: handing a run request to a runtime and returning its result.

``InlineDispatcher`` is the embedded default: the run executes in this process, no Redis needed. Every caller
(the CLI, the ``skill_run`` tool, the HTTP API) goes through a dispatcher, so moving runs onto a queue changes
one object, not its callers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from worker.contract import RunRequest, RunResult
from worker.runtimes import BaseWorkspaceRuntime, resolve_runtime


class BaseDispatcher(ABC):
    """Runs requests somewhere and returns their results."""

    @abstractmethod
    async def run(self, request: RunRequest, *, trusted: bool = False) -> RunResult:
        """Execute ``request``. ``trusted`` callers (not a model) may use host paths for inputs."""

    async def close(self) -> None:
        """Release runtimes and connections."""

    async def __aenter__(self) -> "BaseDispatcher":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class InlineDispatcher(BaseDispatcher):
    """Executes runs in this process with runtimes built on first use."""

    def __init__(
        self,
        runtimes: dict[str, BaseWorkspaceRuntime] | None = None,
        runtime_options: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self._runtimes: dict[str, BaseWorkspaceRuntime] = dict(runtimes or {})
        self._options = runtime_options or {}

    def runtime(self, name: str) -> BaseWorkspaceRuntime:
        if name not in self._runtimes:
            self._runtimes[name] = resolve_runtime(name, **self._options.get(name, {}))
        return self._runtimes[name]

    async def run(self, request: RunRequest, *, trusted: bool = False) -> RunResult:
        return await self.runtime(request.runtime.value).run(request, allow_host_paths=trusted)

    async def close(self) -> None:
        for runtime in self._runtimes.values():
            await runtime.close()
