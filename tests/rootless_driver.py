"""Runs commands on the local runtime as whoever starts it (``tests.normal_user``): a JSON job on stdin, the results
as JSON on stdout's last line (``{"results": [...]}``).

The job: ``skill_root`` (a library), ``options`` for ``resolve_runtime("local", ...)``, and ``runs``, each a
``command`` with any other ``RunRequest`` fields, and three of the driver's own: ``skill`` (default ``probe``),
``end`` (end the one-off workspace after the run, as a job's end does) and ``pause`` (first say
``{"paused": true}`` and wait for a line on stdin: the caller does something between two runs of one runtime).
Each result is the run's ``exit_code``, ``stdout``, ``stderr``, output ``files`` (name: inline content) and
``skipped`` files (name: reason), or the ``error`` (its type and message) the run raised.
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
            if fields.pop("pause", False):
                print(json.dumps({"paused": True}), flush=True)
                sys.stdin.readline()
            skill, end = fields.pop("skill", "probe"), fields.pop("end", False)
            request = RunRequest(skill=SkillRef(name=skill, root=job["skill_root"], path=skill), **fields)
            try:
                result = await runtime.run(request)
                if end:
                    await runtime.end_one_off_workspace(request.workspace_id)
            except WorkerError as exc:
                results.append({"error": f"{type(exc).__name__}: {exc}"})
                continue
            results.append({"exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
                            "files": {file.name: file.content for file in result.output_files},
                            "skipped": {file.name: file.reason for file in result.skipped_files}})
        await runtime.idle()
    return results


if __name__ == "__main__":
    job = json.loads(sys.stdin.readline())
    print(json.dumps({"results": asyncio.run(_main(job))}), flush=True)
