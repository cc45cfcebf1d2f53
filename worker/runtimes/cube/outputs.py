"""A run's command in a Cube sandbox and what comes back from it: the command script, output packing, collection.

A command runs as the sandbox's unprivileged user with an environment built from scratch (``env -i``: the
sandbox's own variables do not leak in), under ``ulimit`` limits, killed with its process group at its timeout.
Once it has exited, the same round trip kills what it left running and packs the files its output patterns may
match (``PACK_SCRIPT``) into one tar archive, whole files up to the caps and heads of longer ones. That archive is
downloaded, never more bytes than asked for, and laid out in a local mirror of the workspace, where output
collection applies the same globs, refusals, caps and MIME detection as everywhere else.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shlex
import shutil
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path

from e2b.exceptions import FileNotFoundException

from worker import defaults
from worker.artifacts import BaseArtifactStore
from worker.collect import Collection, collect_outputs, glob_regex, resolve_patterns
from worker.config import CubeCodeExecutorConfig
from worker.contract import RunRequest
from worker.names import workspace_variables
from worker.errors import RuntimeUnavailableError, UnsafeArchiveError, WorkspaceError
from worker.sandbox.process import remote_ulimit_prefix
from worker.secrets import Redactor, redacting_sink
from worker.runtimes.base import command_environment
from worker.runtimes.cube.executor import KILL_SCRIPT, CubeCodeExecutor, sandbox_error
from worker.runtimes.cube.scripts import PACK_SCRIPT
from worker.workspaces.staging import WORKSPACE_LINKS
from worker.workspaces.tar_transfer import SIZES_MEMBER, extract_mirror
from worker.validation import placeholder_variables

ARTIFACT_DOWNLOAD_BYTES = 1024**3
"""Most bytes of output files fetched for one run that saves artifacts (whole files, not capped heads)."""


def _download_budget(request: RunRequest) -> int:
    """The most output bytes a run's download may carry: whole files when they become artifacts."""
    return ARTIFACT_DOWNLOAD_BYTES if request.save_as_artifacts else request.limits.output_total_bytes


def _remove_mirror(mirror: Path) -> None:
    shutil.rmtree(mirror, ignore_errors=True)
    mirror.with_name(mirror.name + ".tar").unlink(missing_ok=True)


class CubeOutputs:
    """Builds a run's command script and collects its outputs (see the module's description)."""

    def __init__(
        self,
        config: CubeCodeExecutorConfig,
        local_root: Path,
        artifact_store: BaseArtifactStore,
        in_background: Callable[[Coroutine], None],
    ) -> None:
        """Mirrors are made under ``local_root``; ``in_background`` runs clean-up in a sandbox off the run's path."""
        self.config = config
        self.local_root = local_root
        self.artifact_store = artifact_store
        self._in_background = in_background

    # ---- scripts ----------------------------------------------------------------------------------------------
    def command_script(
        self,
        request: RunRequest,
        ws: str,
        run_dir: str,
        cwd: str,
        pack: str,
        limit: float,
        environment: str | None = None,
    ) -> str:
        """Enter ``cwd`` and run the command under ``env -i`` (the environment from scratch, with the skill's
        dependency ``environment`` as ``VIRTUAL_ENV`` and first on ``PATH`` when it has one), killed with its
        process group after ``limit`` seconds (``timeout -s KILL``: 137); once it has exited, in the same round
        trip, kill what it left running and run ``pack`` (``pack_script``); exit with the command's status."""
        variables = workspace_variables(ws, run_dir, request.skill.name)
        env = command_environment(run_dir, request, variables, path=defaults.SANDBOX_PATH, shell="/bin/bash")
        if environment is not None:
            env = {**env, "VIRTUAL_ENV": environment, "PATH": f"{environment}/bin:{env.get('PATH', '')}"}
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

    def pack_script(self, request: RunRequest, ws: str, pack_dir: str) -> str:
        """The script that packs what the request's output patterns may match (nothing when it has none)."""
        variables = placeholder_variables(request.skill.name, ws)
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

    # ---- collection -------------------------------------------------------------------------------------------
    async def collect(
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
                await self.download(executor, f"{pack_dir}/out.tar", download, limit)
            except RuntimeUnavailableError as exc:
                if not isinstance(exc.__cause__, FileNotFoundException):
                    raise
                # The command's round trip did not pack (its pack step failed): again, on its own, with the reason.
                await self._pack(executor, request, run_dir, pack_dir, pack)
                await self.download(executor, f"{pack_dir}/out.tar", download, limit)
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

    async def download(self, executor: CubeCodeExecutor, path: str, dest: Path, limit: int) -> None:
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
        mirror_vars = placeholder_variables(request.skill.name, str(mirror))
        patterns = resolve_patterns(request.output_files, mirror_vars, mirror)
        sink = (redacting_sink(self.artifact_store, request.workspace_id, Redactor(request.redacted_values))
                if request.save_as_artifacts else None)
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


__all__ = ["ARTIFACT_DOWNLOAD_BYTES", "CubeOutputs"]
