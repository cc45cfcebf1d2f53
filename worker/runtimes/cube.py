"""The Cube runtime: skill commands in remote E2B-compatible sandboxes, through the ``e2b`` SDK.

A workspace lives in a sandbox at ``<root>/ws_<exec_id>_<suffix>`` (root ``/workspace/cube_agent`` by default),
laid out as on the other runtimes and created with ``mkdir -p`` before every run, so a sandbox cleaned from
outside recovers. Files move as tar archives: one upload per run at most (the skill when it is not staged yet,
the run's inputs) and one download (the files output patterns may match), symlinks and modes kept. The
download is laid out in a local mirror of the workspace, where output collection applies the same globs,
refusals, caps and MIME detection as everywhere else.

A command runs as the sandbox's unprivileged user with an environment built from scratch (``env -i``: the
sandbox's own variables do not leak in), under ``ulimit`` limits, within the run's timeout (and the config's
``execute_timeout``). When it times out, is cancelled, or leaves processes behind, every process that carries
its ``RUN_DIR`` is killed in the sandbox.

Sandboxes: ``CubeCodeExecutor`` holds one (created, or connected by ``sandbox_id``) and runs code in it; a
runtime built on an executor runs every workspace in that sandbox, next to the executor's own code. A runtime
built without one gives each workspace its own sandbox, found again by metadata (from any worker or a later
CLI call), reused across the workspace's runs and killed when the workspace is closed or has been idle for
``idle_seconds`` (or, with no process left to notice, at the service's ``sandbox_timeout``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import stat
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from e2b import AsyncSandbox, SandboxQuery
from e2b.exceptions import FileNotFoundException, NotFoundException, SandboxNotRunningException

from worker import defaults
from worker.artifacts import FileArtifactStore
from worker.cancellation import Cancellation
from worker.collect import Collection, collect_outputs, resolve_patterns
from worker.config import CubeCodeExecutorConfig, CubeWorkspaceConfig
from worker.contract import InputFile, RunRequest, RunResult, RuntimeName
from worker.errors import InvalidRunRequestError, RuntimeUnavailableError, UnsafeArchiveError, WorkspaceError
from worker.process import TIMEOUT_EXIT_CODE, remote_ulimit_prefix
from worker.runtimes.base import BaseWorkspaceRuntime, command_environment, open_input, run_result
from worker.runtimes.cube_executor import (
    KILL_SCRIPT,
    KILLED_EXIT_CODE,
    REMOTE_TMP,
    CodeExecutionResult,
    CubeCodeExecutor,
    ScriptOutcome,
    open_sandbox,
    sandbox_error,
)
from worker.runtimes.cube_scripts import (
    FAST_GUARD,
    FAST_MISS_EXIT_CODE,
    PACK_SCRIPT,
    PREP_SCRIPT,
    STAGE_SCRIPT,
    glob_regex,
)
from worker.staging import WORKSPACE_LINKS, CopySkillStager, resolve_skill_source, walk_tree
from worker.tar_transfer import SIZES_MEMBER, UploadArchive, extract_mirror
from worker.validation import resolve_cwd, validate_input_name, validate_request
from worker.workspace import METADATA_FILE, Workspace, run_stamp

WORKSPACE_LABEL = "skillrun.workspace"
ROOT_LABEL = "skillrun.root"
ARTIFACT_DOWNLOAD_BYTES = 1024**3
"""Most bytes of output files fetched for one run that saves artifacts (whole files, not capped heads)."""
PACK_GRACE_SECONDS = 30.0
"""Time a run's round trip gets past its command's timeout for killing leftovers and packing outputs (the command
itself is killed in the sandbox at its timeout)."""


def _download_budget(request: RunRequest) -> int:
    """The most output bytes a run's download may carry: whole files when they become artifacts."""
    return ARTIFACT_DOWNLOAD_BYTES if request.save_as_artifacts else request.limits.output_total_bytes


def _remove_mirror(mirror: Path) -> None:
    shutil.rmtree(mirror, ignore_errors=True)
    mirror.with_name(mirror.name + ".tar").unlink(missing_ok=True)


class CubeWorkspaceRuntime(BaseWorkspaceRuntime):
    """Runs skill commands in Cube sandboxes (see the module's description)."""

    name = RuntimeName.CUBE

    def __init__(
        self,
        executor: CubeCodeExecutor | None = None,
        *,
        config: CubeCodeExecutorConfig | None = None,
        workspace_cfg: CubeWorkspaceConfig | None = None,
        work_root: str | os.PathLike[str] | None = None,
        artifact_store: FileArtifactStore | None = None,
        input_file_bytes: int = defaults.INPUT_FILE_BYTES,
        disk_bytes: int | None = None,
    ) -> None:
        if disk_bytes is not None:
            raise RuntimeUnavailableError(
                "cube: per-workspace disk caps are set by the sandbox template, not by skillrun"
            )
        self.executor = executor
        self.config = executor.config if executor is not None else (config or CubeCodeExecutorConfig())
        self.workspace_cfg = workspace_cfg or CubeWorkspaceConfig()
        self.local_root = Path(work_root) if work_root is not None else Path(tempfile.gettempdir())
        self.artifact_store = artifact_store or FileArtifactStore(self.local_root / ".skillrun" / "artifacts")
        self.input_file_bytes = input_file_bytes
        self._signature_stager = CopySkillStager()
        self._content_signatures: dict[tuple[Path, str], str] = {}  # (source, stat signature) → content signature
        self._staged: dict[tuple[str, str, str], str] = {}  # (sandbox, workspace, skill) → signature
        self._owned: dict[str, CubeCodeExecutor] = {}
        self._last_used: dict[str, float] = {}
        self._busy: dict[str, int] = {}  # workspace → runs in progress here
        self._opening: dict[str, asyncio.Lock] = {}
        self._cancels: dict[str, Cancellation] = {}
        self._background: set[asyncio.Task] = set()
        self._lock = threading.Lock()

    # ---- where ------------------------------------------------------------------------------------------------
    def workspace_path(self, workspace_id: str) -> str:
        """The workspace's folder in its sandbox: ``<root>/ws_<exec_id>_<suffix>``, the same from every worker."""
        suffix = hashlib.sha256(workspace_id.encode()).hexdigest()[:8]
        return f"{self.workspace_cfg.root.rstrip('/')}/ws_{workspace_id}_{suffix}"

    async def executor_for(self, workspace_id: str) -> CubeCodeExecutor:
        """The executor whose sandbox holds ``workspace_id``: the shared one, or the workspace's own (found by
        metadata, else created)."""
        if self.executor is not None:
            return self.executor
        await self._close_idle(keep=workspace_id)
        known = self._owned.get(workspace_id)
        if known is not None:
            self._last_used[workspace_id] = time.monotonic()
            return known
        lock = self._opening.setdefault(workspace_id, asyncio.Lock())
        async with lock:
            known = self._owned.get(workspace_id)
            if known is None:
                labels = {WORKSPACE_LABEL: workspace_id, ROOT_LABEL: self.workspace_cfg.root}
                sandbox = await self._find_sandbox(labels)
                known = (
                    CubeCodeExecutor(sandbox, self.config)
                    if sandbox
                    else await CubeCodeExecutor.create(self.config, metadata=labels)
                )
                self._owned[workspace_id] = known
            self._last_used[workspace_id] = time.monotonic()
            return known

    async def _find_sandbox(self, labels: dict[str, str]) -> AsyncSandbox | None:
        if self.config.sandbox_id:
            return None
        options = self.config.connection_options()
        try:
            paginator = AsyncSandbox.list(query=SandboxQuery(metadata=labels), **options)
            found = await paginator.next_items() if paginator.has_next else []
            for info in found:
                with contextlib.suppress(NotFoundException, SandboxNotRunningException):
                    return await AsyncSandbox.connect(info.sandbox_id, **options)
        except Exception as exc:
            raise sandbox_error("looking for the workspace's sandbox", exc) from exc
        return None

    # ---- running ----------------------------------------------------------------------------------------------
    async def run(self, request: RunRequest, *, allow_host_paths: bool = False) -> RunResult:
        validate_request(request, allow_host_paths=allow_host_paths)
        if request.network and not self.config.allow_internet_access:
            raise InvalidRunRequestError(
                "network", "network access is not allowed on this runtime (allow_internet_access=False)"
            )
        cancel = Cancellation()
        with self._lock:
            self._cancels[request.run_id] = cancel
        self._busy[request.workspace_id] = self._busy.get(request.workspace_id, 0) + 1
        try:
            return await self._run(request, cancel)
        finally:
            with self._lock:
                self._cancels.pop(request.run_id, None)
            self._busy[request.workspace_id] -= 1
            if not self._busy[request.workspace_id]:
                del self._busy[request.workspace_id]
            if request.workspace_id in self._last_used:
                self._last_used[request.workspace_id] = time.monotonic()

    async def _run(self, request: RunRequest, cancel: Cancellation) -> RunResult:
        started = time.monotonic()
        source = await asyncio.to_thread(resolve_skill_source, request.skill)
        signature = await asyncio.to_thread(self._skill_signature, source)
        inputs = await asyncio.to_thread(self._input_archive, request.inputs)
        executor = await self.executor_for(request.workspace_id)
        ws = self.workspace_path(request.workspace_id)
        skill_dir = f"{ws}/skills/{request.skill.name}"
        pack_dir = f"{REMOTE_TMP}/skillrun-pack-{uuid.uuid4().hex}"
        pack = self._pack_script(request, ws, pack_dir)
        limit = min(request.timeout, self.config.execute_timeout)
        options = {
            "timeout": request.timeout,
            "grace": PACK_GRACE_SECONDS,
            "stdout_cap": request.limits.stdout_bytes,
            "stderr_cap": request.limits.stderr_bytes,
            "cancel": cancel,
        }
        done = None
        if request.cwd is None and not request.inputs and self._staged.get(self._key(executor, request)) == signature:
            # Staged before by this process: check and make the run folder in the command's own round trip.
            run_dir = f"{ws}/runs/run_{run_stamp()}"
            nonce = uuid.uuid4().hex
            guard = FAST_GUARD.format(
                ws=shlex.quote(ws),
                skill=shlex.quote(request.skill.name),
                signature=shlex.quote(signature),
                run=shlex.quote(run_dir),
                nonce=nonce,
                code=FAST_MISS_EXIT_CODE,
            )
            staged = time.monotonic()
            try:
                done = await executor.run_script(
                    guard + self._command_script(request, ws, run_dir, skill_dir, pack, limit),
                    marker=run_dir,
                    **options,
                )
            except RuntimeUnavailableError:
                executor = await self._replace_if_gone(executor, request.workspace_id)
            if (
                done is not None
                and done.outcome.exit_code == FAST_MISS_EXIT_CODE
                and done.stderr_text == f"{nonce}\n"
                and not await self._exists(executor, run_dir)  # a command cannot fake a miss to run twice
            ):
                self._staged.pop(self._key(executor, request), None)  # changed from outside: the full way
                done = None
        if done is None:
            try:
                prepared = await self._prepare(executor, request, source, signature, inputs)
            except RuntimeUnavailableError:
                executor = await self._replace_if_gone(executor, request.workspace_id)
                prepared = await self._prepare(executor, request, source, signature, inputs)
            run_dir, real_cwd = prepared
            if real_cwd is not None and real_cwd != ws and not real_cwd.startswith(ws + "/"):
                raise InvalidRunRequestError("cwd", f"{request.cwd!r} resolves outside the workspace")
            staged = time.monotonic()
            done = await executor.run_script(
                self._command_script(request, ws, run_dir, real_cwd or skill_dir, pack, limit),
                marker=run_dir,
                **options,
            )
        outcome = done.outcome
        if not outcome.timed_out and outcome.exit_code == KILLED_EXIT_CODE and outcome.duration_ms >= limit * 1000:
            # Killed by the sandbox-side timeout: reported as every runtime reports a timeout.
            outcome.timed_out, outcome.exit_code = True, TIMEOUT_EXIT_CODE
        executed = time.monotonic()

        packed = not (outcome.timed_out or outcome.cancelled)
        collection = await self._collect(executor, request, ws, run_dir, pack_dir, pack, packed)
        finished = time.monotonic()
        stderr = done.stderr_text + ("\n[skillrun: the run was cancelled]\n" if outcome.cancelled else "")
        return run_result(
            request,
            self.name,
            outcome,
            collection,
            stdout=done.stdout_text,
            stderr=stderr,
            marks=(started, staged, executed, finished),
        )

    def _skill_signature(self, source: Path) -> str:
        """What the staged copy of ``source`` is compared with: a digest of its contents, modes and links, so two
        workers with identical libraries in different places agree (the digest is recomputed only when a file's
        size, time or mode changes)."""
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

    async def _exists(self, executor: CubeCodeExecutor, path: str) -> bool:
        done = await executor.run_script(f"[ -e {shlex.quote(path)} ]", timeout=30)
        return done.outcome.exit_code == 0

    @staticmethod
    def _key(executor: CubeCodeExecutor, request: RunRequest) -> tuple[str, str, str]:
        return executor.sandbox_id, request.workspace_id, request.skill.name

    def _command_script(self, request: RunRequest, ws: str, run_dir: str, cwd: str, pack: str, limit: float) -> str:
        """Enter ``cwd`` and run the command under ``env -i`` (the environment from scratch), killed with its
        process group after ``limit`` seconds (``timeout -s KILL``: 137); once it has exited, in the same round
        trip, kill what it left running and run ``pack`` (``_pack_script``); exit with the command's status."""
        variables = Workspace(request.workspace_id, Path(ws)).variables(request.skill.name, Path(run_dir))
        env = command_environment(run_dir, request, variables, path=defaults.SANDBOX_PATH, shell="/bin/bash")
        inner = remote_ulimit_prefix(request.limits) + request.command
        command = (
            '"${deadline[@]}" /usr/bin/env -i '
            + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
            + f" /bin/bash -c {shlex.quote(inner)}"
        )
        after = KILL_SCRIPT.format(marker=shlex.quote(run_dir)) + pack
        # The command's stderr goes to fd 3, the wrapper's own (bash's "Killed" notice) nowhere.
        # Without coreutils' timeout in the template, the caller's deadline (plus the grace) is the only one.
        return (
            f"deadline=(timeout -s KILL {limit:.3f}); command -v timeout >/dev/null || deadline=()\n"
            f"cd -- {shlex.quote(cwd)} || exit 126\n{{ {command} </dev/null 2>&3; }} 3>&2 2>/dev/null; rc=$?\n"
            f"exec >/dev/null 2>&1\n{after}exit $rc\n"
        )

    def _pack_script(self, request: RunRequest, ws: str, pack_dir: str) -> str:
        """The script that packs what the request's output patterns may match (nothing when it has none)."""
        variables = Workspace(request.workspace_id, Path(ws)).variables(request.skill.name, Path(f"{ws}/runs/run"))
        patterns = resolve_patterns(request.output_files, variables, Path(ws))
        if not patterns:
            return ""
        listing = bytearray()
        skill_dir = f"{ws}/skills/{request.skill.name}"
        for pattern in patterns:
            segments = (pattern if pattern.startswith("/") else f"{skill_dir}/{pattern}").split("/")
            # The literal folder the pattern starts from; a literal file is found by name in its folder, so a
            # link there is sent as a link (and refused in collection like anywhere else).
            literal = next((i for i, s in enumerate(segments) if any(c in s for c in "*?[")), len(segments) - 1)
            base = "/".join(segments[:literal]) or "/"
            rest = [s for s in segments[literal:] if s not in ("", ".")]
            depth = 0 if "**" in rest else len(rest)
            listing += b"\0".join(x.encode() for x in (base, str(depth), glob_regex(rest))) + b"\0"
        limits = request.limits
        return PACK_SCRIPT.format(
            ws=shlex.quote(ws),
            pack_dir=shlex.quote(pack_dir),
            cap=-1 if request.save_as_artifacts else limits.output_file_bytes,
            budget=_download_budget(request),
            most=limits.output_max_files + 1,
            sizes=SIZES_MEMBER,
            patterns=base64.b64encode(bytes(listing)).decode(),
        )

    async def _prepare(
        self,
        executor: CubeCodeExecutor,
        request: RunRequest,
        source: Path,
        signature: str,
        inputs: UploadArchive | None,
    ) -> tuple[str, str | None]:
        """Make the workspace (idempotently), place the inputs, make the run folder, and stage the skill when the
        sandbox lacks it (or it changed); return the run folder and the real ``cwd`` paths."""
        key = self._key(executor, request)
        with_skill = self._staged.get(key) != signature
        archive = inputs
        if with_skill:
            archive = await asyncio.to_thread(self._skill_archive, source, request.skill.name, request.inputs)
        upload = await self._upload(executor, archive, user="root" if with_skill else self.config.user)
        lines = await self._prep(executor, request, upload, keep_upload=with_skill)
        if lines.get("sig") != signature:
            if not with_skill:  # staged by someone else, changed, or cleaned up from outside: stage it again
                archive = await asyncio.to_thread(self._skill_archive, source, request.skill.name, [])
                upload = await self._upload(executor, archive, user="root")
            await self._stage(executor, request, upload, signature)
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

    async def _stage(self, executor: CubeCodeExecutor, request: RunRequest, upload: str, signature: str) -> None:
        ws = self.workspace_path(request.workspace_id)
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
        self, executor: CubeCodeExecutor, request: RunRequest, upload: str, *, keep_upload: bool
    ) -> dict[str, str]:
        ws = self.workspace_path(request.workspace_id)
        cwd_check = ""
        if request.cwd is not None:
            placeholder = Workspace(request.workspace_id, Path(ws)).variables(
                request.skill.name, Path(f"{ws}/runs/run")
            )
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

    def _input_archive(self, inputs: list[InputFile]) -> UploadArchive | None:
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

    async def _collect(
        self,
        executor: CubeCodeExecutor,
        request: RunRequest,
        ws: str,
        run_dir: str,
        pack_dir: str,
        pack: str,
        packed: bool,
    ) -> Collection:
        """Fetch the outputs the command's round trip packed with ``pack`` into ``pack_dir`` (or, after a timeout
        or cancel, kill what is left and pack them now) and collect them through a local mirror."""
        if not pack:
            return Collection()
        mirror = Path(tempfile.mkdtemp(prefix=f"cube-{request.run_id[:12]}-", dir=self._mirror_parent()))
        try:
            if not packed:
                await self._pack(executor, request, run_dir, pack_dir, pack)
            limits = request.limits
            budget = _download_budget(request)
            # The file contents, plus a tar header and padding per entry, plus the sizes list.
            limit = budget + 2048 * 3 * (limits.output_max_files + 2) + 1024 * 1024
            download = mirror.with_name(mirror.name + ".tar")
            try:
                await self._download(executor, f"{pack_dir}/out.tar", download, limit)
            except RuntimeUnavailableError as exc:
                if not isinstance(exc.__cause__, FileNotFoundException):
                    raise
                # The command's round trip did not pack (its pack step failed): again, on its own, with the reason.
                await self._pack(executor, request, run_dir, pack_dir, pack)
                await self._download(executor, f"{pack_dir}/out.tar", download, limit)
            return await asyncio.to_thread(self._collect_mirror, download, mirror, ws, request)
        finally:
            self._in_background(executor.run_script(f"rm -rf -- {shlex.quote(pack_dir)}", timeout=30))
            await asyncio.to_thread(_remove_mirror, mirror)

    async def _pack(
        self, executor: CubeCodeExecutor, request: RunRequest, run_dir: str, pack_dir: str, pack: str
    ) -> None:
        """Kill what the run left running and pack its outputs afresh, in a round trip of its own."""
        done = await executor.run_script(
            KILL_SCRIPT.format(marker=shlex.quote(run_dir)) + f"rm -rf -- {shlex.quote(pack_dir)}\n" + pack,
            timeout=min(120.0, self.config.execute_timeout),
        )
        if done.outcome.exit_code != 0:
            raise WorkspaceError(
                f"cube: packing the outputs of run {request.run_id} failed "
                f"(exit {done.outcome.exit_code}): {done.stderr_text.strip()}"
            )

    async def _download(self, executor: CubeCodeExecutor, path: str, dest: Path, limit: int) -> None:
        """Stream the sandbox file ``path`` into ``dest``, refusing more than ``limit`` bytes (the sandbox is not
        trusted to send what it was asked for)."""
        received = 0
        try:
            stream = await executor.sandbox.files.read(path, format="stream", user=self.config.user)
            async with stream:
                with open(dest, "wb") as out:
                    async for chunk in stream:
                        received += len(chunk)
                        if received > limit:
                            raise UnsafeArchiveError(f"the sandbox sent more than {limit} bytes of outputs")
                        await asyncio.to_thread(out.write, chunk)
        except UnsafeArchiveError:
            raise
        except Exception as exc:
            raise sandbox_error("downloading the outputs", exc, executor.sandbox_id) from exc

    def _collect_mirror(self, data: Path, mirror: Path, ws: str, request: RunRequest) -> Collection:
        for d in ("skills", "work/inputs", "out", "runs"):
            (mirror / d).mkdir(parents=True, exist_ok=True)
        skill_dir = mirror / "skills" / request.skill.name
        skill_dir.mkdir(exist_ok=True)
        for entry, target in WORKSPACE_LINKS.items():
            os.symlink(target, skill_dir / entry)
        limits = request.limits
        budget = _download_budget(request)
        sizes = extract_mirror(
            data, mirror, remote_root=ws, max_members=3 * (limits.output_max_files + 1) + 1, max_bytes=budget
        )
        mirror_vars = Workspace(request.workspace_id, mirror).variables(request.skill.name, mirror / "runs" / "run")
        patterns = resolve_patterns(request.output_files, mirror_vars, mirror)
        sink = self.artifact_store.sink(request.workspace_id) if request.save_as_artifacts else None
        return collect_outputs(
            patterns,
            workspace_root=mirror,
            skill_dir=skill_dir,
            limits=limits,
            omit_inline_content=request.omit_inline_content,
            artifact_sink=sink,
            true_sizes=sizes,
        )

    def _mirror_parent(self) -> str:
        parent = self.local_root / ".skillrun" / "cube-mirrors"
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return str(parent)

    # ---- lifecycle --------------------------------------------------------------------------------------------
    def cancel(self, run_id: str) -> bool:
        """Stop a run in progress (its processes are killed in the sandbox); ``False`` if it is not running here."""
        with self._lock:
            found = self._cancels.get(run_id)
        if found is None:
            return False
        found.set()
        return True

    def _in_background(self, work) -> None:  # noqa: ANN001 - a coroutine
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def idle(self) -> None:
        """Wait until background clean-up in the sandboxes is done."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def _replace_if_gone(self, executor: CubeCodeExecutor, workspace_id: str) -> CubeCodeExecutor:
        """After an error: when the workspace's own sandbox expired or was killed, a new one (the workspace is made
        again in it); otherwise the error stands (re-raised)."""
        try:
            gone = not await executor.sandbox.is_running()
        except Exception:
            gone = True
        if self.executor is not None or not gone:
            raise
        self._forget(workspace_id)
        return await self.executor_for(workspace_id)

    def _forget(self, workspace_id: str) -> CubeCodeExecutor | None:
        self._last_used.pop(workspace_id, None)
        executor = self._owned.pop(workspace_id, None)
        if executor is not None:
            for key in [k for k in self._staged if k[0] == executor.sandbox_id]:
                del self._staged[key]
        return executor

    async def _close_idle(self, keep: str | None = None) -> None:
        now = time.monotonic()
        for workspace_id, last in list(self._last_used.items()):
            busy = self._busy.get(workspace_id, 0) > 0
            if workspace_id != keep and not busy and now - last > self.workspace_cfg.idle_seconds:
                executor = self._forget(workspace_id)
                if executor is not None:
                    await executor.close()

    async def close_workspace(self, workspace_id: str) -> None:
        """Close a workspace: its own sandbox is killed; in a shared sandbox its folder is removed."""
        if self.executor is not None:
            path = self.workspace_path(workspace_id)
            done = await self.executor.run_script(f"rm -rf -- {shlex.quote(path)}", timeout=60, user="root")
            for key in [k for k in self._staged if k[1] == workspace_id]:
                del self._staged[key]
            if done.outcome.exit_code != 0:
                raise WorkspaceError(f"cube: removing workspace {workspace_id!r} failed: {done.stderr_text.strip()}")
            return
        executor = self._forget(workspace_id)
        if executor is None:
            labels = {WORKSPACE_LABEL: workspace_id, ROOT_LABEL: self.workspace_cfg.root}
            sandbox = await self._find_sandbox(labels)
            executor = CubeCodeExecutor(sandbox, self.config) if sandbox else None
        if executor is not None:
            await executor.close()

    async def close(self) -> None:
        """Stop runs in progress and finish clean-up. Workspace sandboxes stay up for the next process that serves
        their workspaces (they are found by metadata); they end when idle here, by ``close_workspace``, or at
        the service's sandbox timeout."""
        with self._lock:
            running = list(self._cancels.values())
        for cancel in running:
            cancel.set()
        await self.idle()


__all__ = [
    "CodeExecutionResult",
    "ScriptOutcome",
    "CubeCodeExecutor",
    "CubeWorkspaceRuntime",
    "open_sandbox",
    "sandbox_error",
]
