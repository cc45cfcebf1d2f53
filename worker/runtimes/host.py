"""Runtimes whose workspaces live on this host's file system (local processes, Docker containers).

Everything but starting the command is shared: finding or creating the workspace, staging the skill, the run
directory, inputs written without following planted links, the command's environment built from scratch,
output collection with caps and MIME types, artifacts, timings. A subclass says how the command is executed.

No run's workspace is removed under it by another run's end (``worker.runtimes.workspace_uses``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import time
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from worker import defaults
from worker.artifacts import BaseArtifactStore, FileArtifactStore
from worker.cancellation import Cancellation
from worker.collect import Collection, collect_outputs, resolve_patterns
from worker.contract import WORKSPACE_ID_PATTERN, InputFile, RunRequest, RunResult, SkillRef
from worker.environments import NO_ENVIRONMENT, EnvironmentStatus, RunEnvironment, SkillEnvironments
from worker.environments.builder import Progress
from worker.errors import InvalidRunRequestError, WorkspaceError
from worker.roots.library_fetch import locate, skill_root_in_use
from worker.outcome import ProcessOutcome, decode_output
from worker.secrets import Redactor, redacting_sink
from worker.runtimes.base import BaseWorkspaceRuntime, open_input, run_result
from worker.runtimes.host_files import WorkspaceFiles
from worker.runtimes.workspace_uses import WorkspaceUse, WorkspaceUses
from worker.workspaces.staging import BaseSkillStager, TreeSkillStager, resolve_skill_paths
from worker.validation import resolve_cwd, validate_input_name, validate_request
from worker.workspaces.manager import Workspace, WorkspaceManager

COPY_CHUNK_BYTES = 1024 * 1024
MAX_REMEMBERED_WORKSPACES = 4096
"""Workspaces whose reuse a runtime remembers (a reused workspace gets spare run folders, and maybe a spawner)."""


class HostWorkspaceRuntime(BaseWorkspaceRuntime):
    """A runtime with workspaces under ``workspaces.work_root`` on this host."""

    def __init__(
        self,
        workspaces: WorkspaceManager,
        *,
        environments: SkillEnvironments,
        stager: BaseSkillStager | None = None,
        artifact_store: BaseArtifactStore | None = None,
        input_file_bytes: int = defaults.INPUT_FILE_BYTES,
    ) -> None:
        """``environments`` gives skills their dependency environments (built for where this runtime runs)."""
        self.workspaces = workspaces
        self.uses = WorkspaceUses(workspaces.work_root, workspaces.registry)
        self.environments = environments
        self._skill_paths: dict[SkillRef, tuple[Path, Path]] = {}
        self.stager = stager or TreeSkillStager()
        self.artifact_store = artifact_store or FileArtifactStore(self.workspaces.registry / "artifacts")
        self.input_file_bytes = input_file_bytes
        self._cancels: dict[str, Cancellation] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        # Housekeeping off the runs' path, one job at a time; its thread starts with the first job.
        self._housekeeper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="skillrun-housekeeping")
        self._background: set[Future] = set()
        self._lock = threading.Lock()

    @property
    def work_root(self) -> Path:
        return self.workspaces.work_root

    async def run(self, request: RunRequest, *, allow_host_paths: bool = False) -> RunResult:
        validate_request(request, allow_host_paths=allow_host_paths)
        cancel = Cancellation()
        self._cancels[request.run_id] = cancel
        try:
            async with self._holding_root(request), self._in_workspace(request):
                result = await self._run(request, cancel)
        finally:
            self._cancels.pop(request.run_id, None)
        # Once the result is on its way: the housekeeping thread, woken by the job, contends for the interpreter.
        asyncio.get_running_loop().call_soon(self._prepare_next_run, request.workspace_id)
        return result

    @contextlib.asynccontextmanager
    async def _holding_root(self, request: RunRequest) -> AsyncIterator[None]:
        """A library root fetched into the URL-root cache stays there for the whole run (its staged skill links
        into it): the eviction of a bounded cache passes over it (``worker.roots.library_fetch.skill_root_in_use``)."""
        if not locate(request.skill).remote:
            yield
            return
        with contextlib.ExitStack() as held:
            await asyncio.to_thread(held.enter_context, skill_root_in_use(request.skill))
            yield

    @contextlib.asynccontextmanager
    async def _in_workspace(self, request: RunRequest) -> AsyncIterator[None]:
        """Be one of the runs in the request's workspace for the whole run (``WorkspaceUses``); a run that keeps its
        workspace marks it kept. The last run to leave a workspace marked unwanted removes it, after its result (in
        the background)."""
        self.workspaces.check()  # a work root this account cannot use is one clear error, before anything is made
        use = self.uses.enter(request.workspace_id, block=False)
        if use is None:  # it is being removed: the run starts once it is gone
            use = await asyncio.to_thread(self.uses.enter, request.workspace_id, block=True)
        if request.keep_workspace:
            use.mark_kept()
        try:
            yield
        finally:
            await self._let_go(request.workspace_id, use)

    async def _let_go(self, workspace_id: str, use: WorkspaceUse) -> None:
        if use.leave() and not self._in_background(self._remove_unwanted, workspace_id, use):
            await asyncio.to_thread(self._remove_unwanted, workspace_id, use)

    @contextlib.asynccontextmanager
    async def workspace_files(self, workspace_id: str) -> AsyncIterator[WorkspaceFiles | None]:
        """A workspace this runtime has used, held as a run holds it (never removed under the block), whose files
        this process reads and writes as its user would (``worker.runtimes.host_files``); ``None`` for one it has
        not used, or one being removed."""
        self.workspaces.check()
        use = self.uses.enter(workspace_id, block=False) if WORKSPACE_ID_PATTERN.fullmatch(workspace_id) else None
        if use is None:
            yield None
            return
        try:
            workspace = self.workspaces.find_known(workspace_id)
            yield None if workspace is None else WorkspaceFiles(workspace.path, workspace.uid, workspace.gid)
        finally:
            await self._let_go(workspace_id, use)

    def _remove_unwanted(self, workspace_id: str, use: WorkspaceUse) -> None:
        """Remove a workspace no run is in (``use``: held by this run alone; released here) (blocking)."""
        try:
            with contextlib.suppress(WorkspaceError):  # gone already (removed, or never made)
                self.remove_workspace(workspace_id)
        finally:
            use.close()

    async def end_one_off_workspace(self, workspace_id: str) -> None:
        """Mark the workspace unwanted and remove it now if no run is in it; otherwise the last run in it removes
        it, unless a run that keeps it was in it (``worker.runtimes.workspace_uses``)."""
        if not WORKSPACE_ID_PATTERN.fullmatch(workspace_id):
            raise WorkspaceError(f"invalid workspace id {workspace_id!r}")
        await asyncio.to_thread(self._end_one_off, workspace_id)

    def _end_one_off(self, workspace_id: str) -> None:
        self.workspaces.check()
        use = self.uses.enter(workspace_id, block=True)
        use.mark_unwanted()
        if use.leave():
            self._remove_unwanted(workspace_id, use)

    async def _run(self, request: RunRequest, cancel: Cancellation) -> RunResult:
        started = time.monotonic()
        prepared = self._prepare_quickly(request) or await asyncio.to_thread(self._prepare, request)
        environment = await self._environment(request)
        env = prepared.env if environment is None else environment.variables(prepared.env)
        staged = time.monotonic()

        outcome = await self._execute(prepared.workspace, request, prepared.cwd, env, cancel,
                                      environment=environment or NO_ENVIRONMENT)
        executed = time.monotonic()

        collection = Collection()
        if prepared.patterns:
            sink = (redacting_sink(self.artifact_store, request.workspace_id, Redactor(request.redacted_values))
                    if request.save_as_artifacts else None)
            collection = await asyncio.to_thread(
                collect_outputs, prepared.patterns, workspace_root=prepared.workspace.path,
                skill_dir=prepared.skill_dir, limits=request.limits,
                omit_inline_content=request.omit_inline_content, artifact_sink=sink,
            )
        finished = time.monotonic()

        stderr = decode_output(outcome.stderr, outcome.stderr_omitted)
        if outcome.cancelled:
            stderr += "\n[skillrun: the run was cancelled]\n"
        for note in outcome.notes:
            stderr += f"\n[skillrun: {note}]\n"
        return run_result(
            request, self.name, outcome, collection, stdout=decode_output(outcome.stdout, outcome.stdout_omitted),
            stderr=stderr, marks=(started, staged, executed, finished),
        )

    async def _environment(self, request: RunRequest) -> RunEnvironment | None:
        """The dependency environments of the request's skill (``None`` when it declares none), built first when
        the request waits for them."""
        paths = self._skill_paths.get(request.skill)
        if paths is None:
            paths = self._skill_paths[request.skill] = await asyncio.to_thread(resolve_skill_paths, request.skill)
        root, source = paths
        return await self.environments.for_run(source, root, request.skill.name, wait=request.wait_for_environment)

    async def prepare_environment(self, skill_dir: Path, root: Path, name: str,
                                  progress: Progress | None = None) -> EnvironmentStatus:
        """Build what runs of the skill need here, now (``skillrun skills prepare``, library registration)."""
        return await self.environments.prepare(skill_dir, root, name, progress)

    def environment_status(self, skill_dir: Path, root: Path, name: str) -> EnvironmentStatus:
        """Where what runs of the skill need here stands (no build; blocking)."""
        return self.environments.status(skill_dir, root, name)

    def _prepare(self, request: RunRequest) -> "_Prepared":
        """Make the workspace on first use, stage the skill, make a run folder, write the inputs (blocking)."""
        self._note_use(request.workspace_id)
        workspace = self._acquire(request)
        skill_dir = self.stager.stage(workspace, request.skill)
        prepared = self._prepared(request, workspace, skill_dir, self.workspaces.new_run_dir(workspace))
        for item in request.inputs:
            self._write_input(workspace, item)
        return prepared

    def _acquire(self, request: RunRequest) -> Workspace:
        """The run's workspace, made on its first run (blocking)."""
        return self.workspaces.acquire(request.workspace_id)

    def _prepare_quickly(self, request: RunRequest) -> "_Prepared | None":
        """Prepare the run with metadata system calls only, so on the event loop, when that is all it takes: its
        workspace was used here before, its skill is staged and unchanged, a spare run folder is ready, and it
        brings no inputs. Otherwise ``None``: ``_prepare`` does it in a thread."""
        workspace = self.workspaces.find_known(request.workspace_id)
        if workspace is None or request.inputs:
            return None
        skill_dir = self.stager.current(workspace, request.skill)
        run_dir = self.workspaces.take_spare_run_dir(workspace) if skill_dir is not None else None
        if run_dir is None:
            return None
        self._note_use(request.workspace_id)
        return self._prepared(request, workspace, skill_dir, run_dir)

    def _prepared(self, request: RunRequest, workspace: Workspace, skill_dir: Path, run_dir: Path) -> "_Prepared":
        variables = workspace.variables(request.skill.name, run_dir)
        cwd = self._cwd(request, variables, skill_dir, workspace)
        patterns = resolve_patterns(request.output_files, variables, workspace.path)
        return _Prepared(workspace, skill_dir, cwd, self.command_environment(run_dir, request, variables), patterns)

    def _reused(self, workspace_id: str) -> bool:
        """Whether this runtime ran in ``workspace_id`` before the current run (remembers the recent ones)."""
        return workspace_id in self._seen and self._seen[workspace_id] is not None

    def _note_use(self, workspace_id: str) -> None:
        with self._lock:
            self._seen[workspace_id] = True if workspace_id in self._seen else None
            self._seen.move_to_end(workspace_id)
            while len(self._seen) > MAX_REMEMBERED_WORKSPACES:
                self._seen.popitem(last=False)

    def _prepare_next_run(self, workspace_id: str) -> None:
        """Make a reused workspace's next run directory in the background."""
        workspace = self.workspaces.find_known(workspace_id)
        if workspace is not None and self._reused(workspace_id):
            self._in_background(self.workspaces.prepare_run_dir, workspace)  # closed: no spare folder, then

    def _in_background(self, work: Callable[..., object], *args: object) -> bool:
        """Have the housekeeping thread do ``work(*args)``; ``False`` if the runtime is closed (nothing is done)."""
        try:
            job = self._housekeeper.submit(work, *args)
        except RuntimeError:
            return False
        self._background.add(job)
        job.add_done_callback(self._background.discard)
        return True

    def cancel(self, run_id: str) -> bool:
        """Stop a run in progress (its whole process group is killed); ``False`` if it is not running here."""
        event = self._cancels.get(run_id)
        if event is None:
            return False
        event.set()
        return True

    @abstractmethod
    def command_environment(self, run_dir: Path, request: RunRequest, variables: dict[str, str]) -> dict[str, str]:
        """The command's environment, built from scratch (``runtimes.base.command_environment``)."""

    @abstractmethod
    async def _execute(
        self, workspace: Workspace, request: RunRequest, cwd: str, env: dict[str, str], cancel: Cancellation,
        *, environment: RunEnvironment = NO_ENVIRONMENT,
    ) -> ProcessOutcome:
        """Run ``request.command`` in ``cwd`` with ``env``, within its timeout, limits and ``cancel``; the skill's
        dependency ``environment`` (its folders of the store) is shown to the command read-only."""

    def _forget_workspace(self, workspace: Workspace) -> None:
        """Release what this runtime holds for a workspace that is being removed."""

    def _cwd(self, request: RunRequest, variables: dict[str, str], skill_dir: Path, workspace: Workspace) -> str:
        if request.cwd is None:
            return str(skill_dir)
        target = resolve_cwd(request.cwd, variables, str(skill_dir))
        real, root = os.path.realpath(target), os.path.realpath(workspace.path)
        if real != root and not real.startswith(root + os.sep):
            raise InvalidRunRequestError("cwd", f"{request.cwd!r} resolves outside the workspace")
        if not os.path.isdir(real):
            raise InvalidRunRequestError("cwd", f"{request.cwd!r} is not a directory in the workspace")
        return real

    def _write_input(self, workspace: Workspace, item: InputFile) -> None:
        """Write one input under ``work/inputs`` without following any link a command may have planted there."""
        rel = validate_input_name(item.name)
        source, _ = open_input(item, self.input_file_bytes)
        dir_fd = os.open(workspace.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in ("work", "inputs", *rel.parts[:-1]):
                try:
                    os.mkdir(part, 0o755, dir_fd=dir_fd)
                    if workspace.uid is not None:
                        os.chown(part, workspace.uid, workspace.gid, dir_fd=dir_fd, follow_symlinks=False)
                except FileExistsError:
                    pass
                try:
                    next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                except OSError as exc:
                    raise InvalidRunRequestError("inputs", f"cannot place {item.name!r}: {part!r} is not a folder") from exc
                os.close(dir_fd)
                dir_fd = next_fd
            try:
                # Whatever a command left at this name (a FIFO, a hard link, a symlink) is replaced, never opened.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(rel.parts[-1], dir_fd=dir_fd)
                out_fd = os.open(
                    rel.parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd
                )
            except OSError as exc:
                raise InvalidRunRequestError("inputs", f"cannot write {item.name!r}: {exc.strerror}") from exc
            with os.fdopen(out_fd, "wb") as out:
                if isinstance(source, bytes):
                    out.write(source)
                else:
                    shutil.copyfileobj(source, out, COPY_CHUNK_BYTES)
                if workspace.uid is not None:
                    os.fchown(out.fileno(), workspace.uid, workspace.gid)
        finally:
            os.close(dir_fd)
            if not isinstance(source, bytes):
                source.close()

    async def idle(self) -> None:
        """Wait until background housekeeping (spare run folders) is done."""
        await asyncio.sleep(0)  # the jobs asked for as the last runs' results went out are handed over
        if self._background:
            await asyncio.gather(*(asyncio.wrap_future(job) for job in list(self._background)), return_exceptions=True)

    async def close(self) -> None:
        for cancel in self._cancels.values():
            cancel.set()
        await self.idle()
        self._housekeeper.shutdown(wait=False)
        await asyncio.to_thread(self.environments.close)

    def remove_workspace(self, workspace_id: str) -> None:
        """Delete a workspace and everything in it, and its use file (its marks go with it)."""
        workspace = self.workspaces.find(workspace_id)
        if workspace is None:
            if WORKSPACE_ID_PATTERN.fullmatch(workspace_id):
                self.uses.forget(workspace_id)
            raise WorkspaceError(f"no workspace {workspace_id!r}")
        self._forget_workspace(workspace)
        with self._lock:
            self._seen.pop(workspace_id, None)
        self.stager.forget(workspace)
        self.workspaces.remove(workspace_id)
        self.uses.forget(workspace_id)

    async def end_workspace(self, workspace_id: str) -> None:
        await asyncio.to_thread(self.remove_workspace, workspace_id)


@dataclass(frozen=True)
class _Prepared:
    """What a run needs once its workspace is ready."""

    workspace: Workspace
    skill_dir: Path
    cwd: str
    env: dict[str, str]
    patterns: list[str]
