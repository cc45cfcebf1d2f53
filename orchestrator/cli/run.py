"""``skillrun run``: one skill command in a workspace on the local runtime."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

from orchestrator.cli import UsageError
from orchestrator.cli.common import repository
from orchestrator.cli.output import print_json, size, table, write
from orchestrator.config import get_settings
from orchestrator.dispatch import InlineDispatcher
from worker.artifacts import create_artifact_store
from worker.contract import InputFile, RunRequest, RunResult, RuntimeName
from worker.environments import SkillEnvironments
from worker.outcome import TIMEOUT_EXIT_CODE
from worker.runtimes import resolve_runtime
from worker.workspaces import resolve_skill_paths


def run_skill(args: argparse.Namespace) -> int:
    repo = repository(args)
    ref = repo.skill_ref(args.skill)
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    inputs = []
    for item in args.input:
        path, sep, name = item.rpartition("=")
        if not sep:
            path, name = item, os.path.basename(item)
        if not os.path.isfile(path):
            raise UsageError(f"--input {item!r}: {path!r} is not a file")
        inputs.append(InputFile(name=name, host_path=os.path.abspath(path)))
    fields: dict = {
        "skill": ref, "command": args.command, "env": env, "output_files": args.output, "inputs": inputs,
        "workspace_id": args.workspace or uuid.uuid4().hex[:12], "keep_workspace": args.workspace is not None,
        "save_as_artifacts": args.artifacts, "egress": args.egress,
    }
    if args.timeout is not None:
        fields["timeout"] = args.timeout
    request = RunRequest(runtime=args.runtime, **fields)
    settings = get_settings()
    # The worker settings' runtime (OCI runtime, limits), but no warm pool: this process makes one run, and
    # containers made for a next run would only be made and removed on the way out
    once = {"pool_size": 0} if request.runtime == RuntimeName.DOCKER else {}
    runtime = resolve_runtime(args.runtime, work_root=args.work_root or settings.work_root,
                              artifact_store=create_artifact_store(settings.blob_url, settings.artifacts_dir), **once)
    result = asyncio.run(_dispatch(InlineDispatcher({args.runtime: runtime}), request, quiet=args.json))
    if args.json:
        print_json(result.model_dump(mode="json"))
    else:
        _print_result(request, result)
    return TIMEOUT_EXIT_CODE if result.timed_out else result.exit_code


async def _dispatch(dispatcher: InlineDispatcher, request: RunRequest, *, quiet: bool) -> RunResult:
    async with dispatcher:
        runtime = dispatcher.runtime(request.runtime.value)
        if getattr(runtime, "environments", None) is not None:
            await _build_environment(runtime.environments, request, quiet=quiet)
        return await dispatcher.run(request, trusted=True)


async def _build_environment(environments: SkillEnvironments, request: RunRequest, *, quiet: bool) -> None:
    """Build the skill's dependency environment first when it is not ready, showing progress (the run itself
    would build it silently)."""
    root, source = await asyncio.to_thread(resolve_skill_paths, request.skill)
    status = environments.status(source, root, request.skill.name)
    if status.state in ("not built", "building", "failed"):
        def progress(message: str) -> None:
            if not quiet:
                print(f"{request.skill.name}: {message}", file=sys.stderr, flush=True)

        status = await environments.prepare(source, root, request.skill.name, progress)
    if status.state in ("failed", "invalid"):
        raise UsageError(status.message)


def _workspace_note(request: RunRequest) -> str:
    if request.keep_workspace:
        return f"workspace {request.workspace_id} (reuse: --workspace {request.workspace_id})"
    return "workspace removed (name one with --workspace to keep it)"


def _print_result(request: RunRequest, result: RunResult) -> None:
    """The run's output as it printed it, its files in a table; on a terminal, with control characters escaped."""
    write(sys.stdout, result.stdout)
    sys.stdout.flush()
    write(sys.stderr, result.stderr)
    status = f"timed out (killed, exit {TIMEOUT_EXIT_CODE})" if result.timed_out else f"exit {result.exit_code}"
    lines = [f"── {status} · {result.duration_ms} ms · {_workspace_note(request)}"]
    if result.output_files:
        rows = [[f.name, size(f.size) + (" (truncated)" if f.truncated else ""), f.mime_type] for f in result.output_files]
        lines.append(table(["OUTPUT FILE", "SIZE", "MIME TYPE"], rows))
    for artifact in result.artifact_files:
        lines.append(f"artifact {artifact.name} v{artifact.version} ({size(artifact.size)})")
    for skipped in result.skipped_files:
        lines.append(f"skipped {skipped.name}: {skipped.reason}")
    if result.egress_refused:
        lines.append(f"egress refused {result.egress_refused} connection(s):")
        lines += [f"  {refusal.destination}: {refusal.reason}" for refusal in result.egress_refusals]
    write(sys.stderr, "\n".join(lines) + "\n")
