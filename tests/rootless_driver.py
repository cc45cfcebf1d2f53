"""Runs commands on the local runtime as whoever starts it (``tests.normal_user``): a JSON job on stdin, the results
as JSON on stdout.

The job: ``skill_root`` (a library with a ``probe`` skill), ``options`` for ``resolve_runtime("local", ...)``, and
``runs``, each a ``command`` with any other ``RunRequest`` fields. Each result is the run's ``exit_code``,
``stdout`` and ``stderr``, or the ``error`` (its type and message) the run raised.
"""

from __future__ import annotations

import asyncio
import json
import sys

from worker.contract import RunRequest, SkillRef
from worker.errors import WorkerError
from worker.runtimes import resolve_runtime


async def _main(job: dict) -> list[dict]:
    results = []
    async with resolve_runtime("local", **job["options"]) as runtime:
        for fields in job["runs"]:
            request = RunRequest(skill=SkillRef(name="probe", root=job["skill_root"], path="probe"), **fields)
            try:
                result = await runtime.run(request)
            except WorkerError as exc:
                results.append({"error": f"{type(exc).__name__}: {exc}"})
                continue
            results.append({"exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
                            "output_files": [file.name for file in result.output_files]})
    return results


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_main(json.load(sys.stdin)))))
