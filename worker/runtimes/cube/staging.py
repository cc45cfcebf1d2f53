"""Getting a run's skill and inputs into its workspace in a Cube sandbox, and making its run folder.

Files move as one tar archive per run at most: the skill when the sandbox lacks it or it changed, and the run's
inputs. The sandbox user makes the workspace's folders, places the inputs and makes the run folder
(``PREP_SCRIPT``); root stages the skill (``STAGE_SCRIPT``), so a command can change neither the staged skill nor
which folder is staged. What a skill is compared by is a digest of its contents, so workers with identical
libraries in different places agree on it and stage it once.

A workspace this process staged before takes a faster way: the check that the skill is still there and unchanged,
and the new run folder, go in the command's own round trip (``FAST_GUARD``); a miss falls back to the full way.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shlex
import stat
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from worker import defaults
from worker.config import CubeCodeExecutorConfig
from worker.contract import InputFile, RunRequest
from worker.errors import InvalidRunRequestError, WorkspaceError
from worker.runtimes.base import open_input
from worker.runtimes.cube.executor import REMOTE_TMP, CubeCodeExecutor, ScriptOutcome, sandbox_error
from worker.runtimes.cube.scripts import FAST_GUARD, FAST_MISS_EXIT_CODE, PREP_SCRIPT, STAGE_SCRIPT
from worker.workspaces.staging import CopySkillStager, walk_tree
from worker.workspaces.tar_transfer import UploadArchive
from worker.validation import placeholder_variables, resolve_cwd, validate_input_name
from worker.workspaces.manager import METADATA_FILE, run_stamp


@dataclass(frozen=True)
class FastGuard:
    """The check put before a command in a workspace this process staged, and the run folder it makes."""

    script: str
    run_dir: str
    nonce: str


class CubeStaging:
    """Stages skills and inputs into workspaces in Cube sandboxes (see the module's description)."""

    def __init__(
        self,
        config: CubeCodeExecutorConfig,
        in_background: Callable[[Coroutine], None],
        *,
        input_file_bytes: int = defaults.INPUT_FILE_BYTES,
    ) -> None:
        """``in_background`` runs clean-up in a sandbox off the run's path (the runtime's, which waits for it
        when idle or closed)."""
        self.config = config
        self._in_background = in_background
        self.input_file_bytes = input_file_bytes
        self._signature_stager = CopySkillStager()
        self._content_signatures: dict[tuple[Path, str], str] = {}  # (source, stat signature) → content signature
        self._staged: dict[tuple[str, str, str], str] = {}  # (sandbox, workspace, skill) → signature

    # ---- what is staged -----------------------------------------------------------------------------------------
    def signature(self, source: Path) -> str:
        """What the staged copy of ``source`` is compared with: a digest of its contents, modes and links, so two
        workers with identical libraries in different places agree (the digest is recomputed only when a file's
        size, time or mode changes). Blocking."""
        key = (source, self._signature_stager.signature(source))
        known = self._content_signatures.get(key)
        if known is None:
            digest = hashlib.sha256()
            for rel, path, info in walk_tree(source):
                digest.update(f"{rel}\0{stat.S_IFMT(info.st_mode)}\0{stat.S_IMODE(info.st_mode) & 0o111}\0".encode())
                if stat.S_ISLNK(info.st_mode):
                    digest.update(os.readlink(path).encode())
                elif stat.S_ISREG(info.st_mode):
                    with open(path, "rb") as f:
                        digest.update(hashlib.file_digest(f, "sha256").digest())
            known = self._content_signatures[key] = "sha256:" + digest.hexdigest()
        return known

    def forget_sandbox(self, sandbox_id: str) -> None:
        """Forget what was staged in a sandbox that is gone."""
        for key in [k for k in self._staged if k[0] == sandbox_id]:
            del self._staged[key]

    def forget_workspace(self, workspace_id: str) -> None:
        """Forget what was staged in a workspace that was removed."""
        for key in [k for k in self._staged if k[1] == workspace_id]:
            del self._staged[key]

    @staticmethod
    def _key(executor: CubeCodeExecutor, request: RunRequest) -> tuple[str, str, str]:
        return executor.sandbox_id, request.workspace_id, request.skill.name

    # ---- the fast way -----------------------------------------------------------------------------------------
    def fast_guard(self, executor: CubeCodeExecutor, request: RunRequest, ws: str, signature: str) -> FastGuard | None:
        """The guard for a run that needs nothing uploaded into a workspace where this process staged the same
        skill (else ``None``: the full way, ``prepare``)."""
        if request.cwd is not None or request.inputs or self._staged.get(self._key(executor, request)) != signature:
            return None
        run_dir = f"{ws}/runs/run_{run_stamp()}"
        nonce = uuid.uuid4().hex
        script = FAST_GUARD.format(
            ws=shlex.quote(ws),
            skill=shlex.quote(request.skill.name),
            signature=shlex.quote(signature),
            run=shlex.quote(run_dir),
            nonce=nonce,
            code=FAST_MISS_EXIT_CODE,
        )
        return FastGuard(script, run_dir, nonce)

    async def missed(
        self, executor: CubeCodeExecutor, request: RunRequest, guard: FastGuard, done: ScriptOutcome
    ) -> bool:
        """Whether the guard found the workspace changed from outside and did not run the command (then the
        full way must be taken)."""
        if (
            done.outcome.exit_code == FAST_MISS_EXIT_CODE
            and done.stderr_text == f"{guard.nonce}\n"
            and not await self._exists(executor, guard.run_dir)  # a command cannot fake a miss to run twice
        ):
            self._staged.pop(self._key(executor, request), None)
            return True
        return False

    async def _exists(self, executor: CubeCodeExecutor, path: str) -> bool:
        done = await executor.run_script(f"[ -e {shlex.quote(path)} ]", timeout=30)
        return done.outcome.exit_code == 0

    # ---- the full way -----------------------------------------------------------------------------------------
    async def prepare(
        self,
        executor: CubeCodeExecutor,
        request: RunRequest,
        ws: str,
        source: Path,
        signature: str,
        inputs: UploadArchive | None,
    ) -> tuple[str, str | None]:
        """Make the workspace ``ws`` (idempotently), place the inputs, make the run folder, and stage the skill
        when the sandbox lacks it (or it changed); return the run folder and the real ``cwd`` paths."""
        key = self._key(executor, request)
        with_skill = self._staged.get(key) != signature
        archive = inputs
        if with_skill:
            archive = await asyncio.to_thread(self._skill_archive, source, request.skill.name, request.inputs)
        upload = await self._upload(executor, archive, user="root" if with_skill else self.config.user)
        lines = await self._prep(executor, request, ws, upload, keep_upload=with_skill)
        if lines.get("sig") != signature:
            if not with_skill:  # staged by someone else, changed, or cleaned up from outside: stage it again
                archive = await asyncio.to_thread(self._skill_archive, source, request.skill.name, [])
                upload = await self._upload(executor, archive, user="root")
            await self._stage(executor, request, ws, upload, signature)
        elif with_skill and upload:  # already staged there (by another worker): the root-owned upload goes
            self._in_background(executor.run_script(f"rm -f -- {shlex.quote(upload)}", timeout=30, user="root"))
        self._staged[key] = signature
        return lines["run"], lines.get("cwd")

    async def _upload(self, executor: CubeCodeExecutor, archive: UploadArchive | None, *, user: str) -> str:
        if archive is None or not archive.members:
            return ""
        upload = f"{REMOTE_TMP}/skillrun-up-{uuid.uuid4().hex}.tar"
        try:
            await executor.sandbox.files.write(upload, archive.getvalue(), user=user, use_octet_stream=True)
        except Exception as exc:
            raise sandbox_error("uploading the skill and inputs", exc, executor.sandbox_id) from exc
        return upload

    async def _stage(
        self, executor: CubeCodeExecutor, request: RunRequest, ws: str, upload: str, signature: str
    ) -> None:
        metadata = json.dumps(
            {
                "workspace_id": request.workspace_id,
                "runtime": "cube",
                "created_at": datetime.now(timezone.utc).isoformat(),
            }
        )
        script = STAGE_SCRIPT.format(
            ws=shlex.quote(ws),
            skill=shlex.quote(request.skill.name),
            upload=shlex.quote(upload),
            signature=shlex.quote(signature),
            metadata=METADATA_FILE,
            metadata_json=shlex.quote(metadata),
        )
        done = await executor.run_script(script, timeout=min(60.0, self.config.execute_timeout), user="root")
        if done.outcome.exit_code != 0:
            raise WorkspaceError(
                f"cube: staging skill {request.skill.name!r} into sandbox {executor.sandbox_id} failed "
                f"(exit {done.outcome.exit_code}): {done.stderr_text.strip()}"
            )

    async def _prep(
        self, executor: CubeCodeExecutor, request: RunRequest, ws: str, upload: str, *, keep_upload: bool
    ) -> dict[str, str]:
        cwd_check = ""
        if request.cwd is not None:
            placeholder = placeholder_variables(request.skill.name, ws)
            target = resolve_cwd(request.cwd, placeholder, f"{ws}/skills/{request.skill.name}")
            # The real path as base64: a folder name with a newline cannot add lines of its own.
            cwd_check = f'cd -- {shlex.quote(target)} 2>/dev/null && [ -d . ] && echo "cwd=$(pwd -P | base64 -w0)" || echo "cwd=-"'
        script = PREP_SCRIPT.format(
            ws=shlex.quote(ws),
            skill=shlex.quote(request.skill.name),
            upload=shlex.quote(upload),
            inputs="1" if request.inputs else "''",
            keep="1" if keep_upload else "''",
            stamp=run_stamp(),
            cwd_check=cwd_check,
        )
        done = await executor.run_script(script, timeout=min(60.0, self.config.execute_timeout))
        if done.outcome.exit_code != 0:
            raise WorkspaceError(
                f"cube: preparing workspace {request.workspace_id!r} in sandbox {executor.sandbox_id} "
                f"failed (exit {done.outcome.exit_code}): {done.stderr_text.strip()}"
            )
        lines: dict[str, str] = {}
        for line in done.stdout_text.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                lines.setdefault(key, value)
        if lines.get("cwd") == "-":
            raise InvalidRunRequestError("cwd", f"{request.cwd!r} is not a directory in the workspace")
        if "cwd" in lines:
            lines["cwd"] = base64.b64decode(lines["cwd"]).decode("utf-8", "surrogateescape")
        run = lines.get("run", "")
        if not run.startswith(f"{ws}/runs/run_") or "/" in run[len(ws) + 6 :]:
            raise WorkspaceError(f"cube: the sandbox did not make a run folder: {done.stdout_text!r}")
        return lines

    # ---- archives ---------------------------------------------------------------------------------------------
    def input_archive(self, inputs: list[InputFile]) -> UploadArchive | None:
        """The run's inputs as an upload (``None`` without any). Blocking."""
        if not inputs:
            return None
        archive = UploadArchive()
        self._add_inputs(archive, inputs)
        return archive

    def _skill_archive(self, source: Path, name: str, inputs: list[InputFile]) -> UploadArchive:
        archive = UploadArchive()
        archive.add_skill(source, name)
        self._add_inputs(archive, inputs)
        return archive

    def _add_inputs(self, archive: UploadArchive, inputs: list[InputFile]) -> None:
        for item in inputs:
            rel = validate_input_name(item.name)
            source, size = open_input(item, self.input_file_bytes)
            if isinstance(source, bytes):
                archive.add_input(rel, source, size)
            else:
                with source:
                    archive.add_input(rel, source, size)


__all__ = ["CubeStaging", "FastGuard"]
