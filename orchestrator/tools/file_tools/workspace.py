"""Workspace mode (ours): the file tools act inside the session's workspace — the one ``skill_run`` uses — through
the same dispatcher and runtime, so they have its sandbox, its limits and no host access.

Each call acts in the session's workspace (``<user>.<session>``, as ``skill_run``), and no host path is touched:

* ``Read`` and ``Write`` of a plain path in a workspace the dispatcher reaches from this process (the embedded
  default's, on a host runtime) need no run: the dispatcher reads or writes the file directly, as the workspace's
  user would, declining any path with a link on it, a file that is not plain, or one the user does not own
  (``worker.runtimes.host_files``); a read has the team's secrets taken out, as a run's output has. Everything
  declined, and every other dispatcher, goes through a run:
* ``Read`` — a run of ``:`` whose output collection takes the file (capped at the read cap; a link out of the
  workspace is refused by the collection); its bytes are answered here as host mode answers them.
* ``Write`` — the content staged as an input, moved into place by a short script that resolves the target
  (``realpath``) and refuses it outside the workspace; the staged input is removed whatever happens.
* ``Edit``, ``Grep``, ``Glob`` (and a Read that collection cannot serve) — the operations module host mode calls,
  run in the sandbox (``python3 -I -S``, as the staged empty skill's ``ops.py``, or as ``-c <its source>`` when
  a library skill is staged instead) with ``$WORKSPACE_DIR`` as its root; large arguments travel as an input.
* ``Bash`` — the command, with ``cwd`` inside the workspace and the run's timeout (the runtime kills it whole).

Paths are relative to the workspace root (``work/notes.txt``, ``out/report.md``), and answers show them that way.
The run stages a skill: the library's ``skill`` when given, else an empty one shipped here (``workspace_skill/``;
a queue worker on another machine needs ``skill`` from the library instead).
"""

from __future__ import annotations

import base64
import inspect
import json
import posixpath
import shlex
import uuid
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.context import InvocationContext
from orchestrator.errors import OrchestratorError, ToolError, UnencodableTextError
from orchestrator.skills.tools.skill_toolset import SkillToolSet, workspace_id_for
from orchestrator.text import check_text
from orchestrator.tools.file_tools.backends import BaseFileBackend, bash_answer, check_timeout
from orchestrator.tools.file_tools.toolset import FileToolSet
from orchestrator.tools.file_tools.workspace_skill import ops as _ops
from worker.collect import expand_braces
from worker.contract import InputFile, RunLimits, RunRequest, SkillRef
from worker.errors import WorkerError

GLOBS_IMPORT = "    from worker.collect import expand_braces, segments_match\n"


def sandbox_source() -> str:
    """The operations as one text a sandbox's python runs: the glob module's text, then the operations' without
    their import of it and without their own ``__future__`` import (which must come first, as the module's does)."""
    operations = Path(_ops.__file__).read_text(encoding="utf-8")
    if operations.count(GLOBS_IMPORT) != 1:
        raise ToolError("the file tools' operations no longer import the glob module as workspace.py expects")
    operations = operations.replace(GLOBS_IMPORT, "    pass\n").replace("from __future__ import annotations\n", "", 1)
    return Path(inspect.getfile(expand_braces)).read_text(encoding="utf-8") + "\n\n" + operations


OPS_SOURCE = sandbox_source()
OPS_SCRIPT = '"$SKILLS_DIR/file-tools/ops.py"'
"""The operations as the staged empty skill carries them: a short command, which the workspace's ready shell takes
(``QUICK_COMMAND_CHARS``); with a library ``skill`` staged instead, and for Glob (which needs the glob module), their
source with the glob module's goes on the command line."""
WORKSPACE_SKILL = Path(__file__).resolve().parent / "workspace_skill"
QUICK_COMMAND_CHARS = 2048
"""A command this short fits, with the run's variables, in one atomic pipe write (``PIPE_BUF``, 4 KiB) to the
workspace's ready shell (``worker.sandbox.ready_shell``); a longer one starts a sandbox of its own (about 35 ms more here)."""
INLINE_ARGS_CHARS = QUICK_COMMAND_CHARS // 2
"""Arguments (quoted for the shell) up to this long travel in the command; longer ones as an input file."""
ARGS_FOLDER = ".file-tools"
ROOT = "$WORKSPACE_DIR"
"""Where every run of the tools starts (Bash's default too): one folder, so the ready shell a call leaves behind
fits the next call, whichever tool it is (``ReadyShell.fits``)."""
WRITE_OUTSIDE, WRITE_FOLDER = 90, 91
WRITE_SCRIPT = """\
{prelude}root=$(realpath -- "$WORKSPACE_DIR") && target=$(realpath -m -- "$root"/{target}) || exit 1
case "$target" in "$root"/*) ;; *) exit 90 ;; esac
[ -d "$target" ] && exit 91
mkdir -p -- "$(dirname -- "$target")" && {source} {redirect} "$target" && printf '%s\\n' "${{target#"$root"/}}"
"""
"""Write in the workspace: exit 90 for a target outside it, 91 for a folder; prints the path it wrote. Short content
is in the script (see ``QUICK_COMMAND_CHARS``), more is staged."""
GLOB_CHARACTERS = frozenset("*?[]{}")
"""A path with these is read by the operations module (collection would take it for a pattern)."""


class WorkspaceFileBackend(BaseFileBackend):
    """The session's workspace, reached through ``skill_tools``' dispatcher (its runtime, limits and
    ``run_tool_kwargs``: runtime, limits, timeout)."""

    def __init__(self, skill_tools: SkillToolSet, *, skill: str | None = None) -> None:
        self.skill_tools = skill_tools
        self.skill = skill

    def _skill_ref(self) -> SkillRef:
        if self.skill is not None:
            return self.skill_tools.repository.skill_ref(self.skill)
        return SkillRef(name="file-tools", root=str(WORKSPACE_SKILL))

    def _request(self, tool_context: InvocationContext | None, *, limits_update: dict[str, int] | None = None,
                 **fields: Any) -> RunRequest:
        """A run in the session's workspace with ``skill_tools``' runtime, limits and timeout (``fields`` win)."""
        if tool_context is None or tool_context.session is None:
            raise _ops.Refused("workspace file tools need a session (they act in the session's workspace)")
        kwargs = self.skill_tools.run_tool_kwargs
        limits = RunLimits.model_validate(kwargs.get("limits") or {})
        if limits_update:
            limits = limits.model_copy(update=limits_update)
        options = {k: kwargs[k] for k in ("runtime", "timeout") if k in kwargs}
        session = tool_context.session
        return RunRequest(skill=self._skill_ref(), workspace_id=workspace_id_for(session.user_id, session.id),
                          limits=limits, **{**options, **fields})

    def _direct(self, request: RunRequest, tool_context: InvocationContext):
        """The workspace's files without a run, where the dispatcher reaches them (``None`` otherwise)."""
        return self.skill_tools.dispatcher.workspace_files(request, owner=tool_context.session.user_id)

    async def _dispatch(self, request: RunRequest, tool_context: InvocationContext):
        return await self.skill_tools.dispatcher.run(request, owner=tool_context.session.user_id)

    async def operate(self, operation: str, args: dict[str, Any], tool_context: InvocationContext | None) -> dict:
        if operation == "read" and not GLOB_CHARACTERS.intersection(args["path"]):
            answer = await self._collect_read(args, tool_context)
            if answer is not None:
                return answer
        if operation == "write":
            return await self._staged_write(args, tool_context)
        raw = json.dumps(args)
        inputs, argument = [], shlex.quote(raw)
        if len(argument) > INLINE_ARGS_CHARS:  # the file's name is ours (no quoting needed); $WORK_DIR is expanded
            name = f"{ARGS_FOLDER}/{uuid.uuid4().hex}.json"
            inputs.append(InputFile(name=name, content=raw.encode("utf-8")))
            argument = f'"@$WORK_DIR/inputs/{name}"'
        quick = self.skill is None and operation != "glob"
        program = OPS_SCRIPT if quick else f"-c {shlex.quote(OPS_SOURCE)}"
        command = f'exec python3 -I -S {program} "$WORKSPACE_DIR" {operation} {argument}'
        try:
            request = self._request(tool_context, command=command, inputs=inputs, cwd=ROOT)
            result = await self._dispatch(request, tool_context)
        except _ops.Refused as exc:
            return _ops.failure(str(exc))
        except (WorkerError, OrchestratorError) as exc:
            return _ops.failure(f"{operation} could not run in the workspace: {exc}")
        lines = result.stdout.strip().splitlines()
        if result.exit_code == 0 and lines:
            try:
                return json.loads(lines[-1])
            except ValueError:
                pass
        if result.stdout_truncated:
            return _ops.failure(f"{operation}'s answer is larger than the run's output limit ({request.limits.stdout_bytes}"
                                f" bytes): ask for less (a line range, a narrower pattern, fewer results)")
        why = "it timed out" if result.timed_out else f"exit code {result.exit_code}: {result.stderr.strip()[-500:]}"
        return _ops.failure(f"{operation} failed in the workspace ({why})")

    async def _collect_read(self, args: dict[str, Any], tool_context: InvocationContext | None) -> dict | None:
        """Read as a run that only collects the file (the runtime's collection: capped, never following a link out
        of the workspace) — no interpreter started. ``None`` for a file that may be text but is not UTF-8
        (collection gives its bytes, whose redaction cannot see a secret in another encoding): the operations
        module reads it, and its answer is redacted as text."""
        path = args["path"]
        try:
            where = _inside(path, "path")
            request = self._request(tool_context, command=":", output_files=[f"$WORKSPACE_DIR/{where}"], cwd=ROOT,
                                    limits_update={"output_file_bytes": _ops.MAX_READ_BYTES})
            async with self._direct(request, tool_context) as files:
                text = None if files is None else await files.read_text(
                    where, _ops.MAX_READ_BYTES, lambda data: _ops.decode(data, path))
            if text is not None:
                return _ops.text_answer(text, path, args.get("start_line"), args.get("end_line"))
            result = await self._dispatch(request, tool_context)
            if result.skipped_files:
                reason = result.skipped_files[0].reason
                if "outside the workspace" in reason:
                    raise _ops.Refused(f"path {path!r} is outside the workspace; only paths inside it may be used")
                raise _ops.Refused(f"{path} {reason}")
            if not result.output_files:
                raise _ops.Refused(f"file not found: {path}")
            found = result.output_files[0]
            if found.truncated or found.size > _ops.MAX_READ_BYTES:
                raise _ops.Refused(_ops.over_read_cap(path, found.size))
            if found.encoding != "base64":
                return _ops.read_answer(found.content.encode("utf-8"), path, args.get("start_line"),
                                        args.get("end_line"))
            data = base64.b64decode(found.content)
            if b"\0" not in data[:_ops.SNIFF_BYTES]:  # text in another encoding: the run redacted only its bytes
                return None
            return _ops.read_answer(data, path, args.get("start_line"), args.get("end_line"))
        except _ops.Refused as exc:
            return _ops.failure(str(exc))
        except (WorkerError, OrchestratorError) as exc:
            return _ops.failure(f"read could not run in the workspace: {exc}")
        except OSError as exc:
            return _ops.failure(f"{path} could not be read: {exc.strerror}")

    async def _staged_write(self, args: dict[str, Any], tool_context: InvocationContext | None) -> dict:
        """Write as a staged input moved into place by a short shell script (no interpreter started): the target's
        fully resolved path must be inside the workspace (``realpath``, so a link out — of the file or a folder
        above it — is refused), and the staged input is removed whatever happens."""
        path = args["path"]
        try:
            where = _inside(path, "path")
            _text(args["content"], "content")
            data = args["content"].encode("utf-8")
            if len(data) > _ops.MAX_WRITE_BYTES:
                raise _ops.Refused(f"content is {len(data)} bytes; Write takes up to {_ops.MAX_WRITE_BYTES} bytes")
            inputs, prelude, source = [], "", f"printf '%s' {shlex.quote(args['content'])}"
            if len(source) > QUICK_COMMAND_CHARS - len(WRITE_SCRIPT) - len(where) or b"\0" in data:  # no NUL in bash
                staged = f"{ARGS_FOLDER}/{uuid.uuid4().hex}"
                inputs.append(InputFile(name=staged, content=data))
                prelude = f"src=\"$WORK_DIR/inputs/{staged}\"; trap 'rm -f -- \"$src\"' EXIT\n"
                source = 'cat -- "$src"'
            request = self._request(tool_context, command=":", cwd=ROOT)
            async with self._direct(request, tool_context) as files:
                if files is not None and await files.write(where, data, append=bool(args.get("append")),
                                                           max_size=request.limits.file_size_bytes):
                    return _written(where, data, args)
            script = WRITE_SCRIPT.format(prelude=prelude, target=shlex.quote(where), source=source,
                                         redirect=">>" if args.get("append") else ">")
            request = self._request(tool_context, command=script, inputs=inputs, cwd=ROOT)
            result = await self._dispatch(request, tool_context)
            if result.exit_code == WRITE_OUTSIDE:
                raise _ops.Refused(f"path {path!r} is outside the workspace; only paths inside it may be used")
            if result.exit_code == WRITE_FOLDER:
                raise _ops.Refused(f"{path} is a directory")
            if result.exit_code != 0 or not result.stdout.strip():
                raise _ops.Refused(f"write failed in the workspace: {result.stderr.strip()[-500:]}")
        except _ops.Refused as exc:
            return _ops.failure(str(exc))
        except (WorkerError, OrchestratorError) as exc:
            return _ops.failure(f"write could not run in the workspace: {exc}")
        except OSError as exc:
            return _ops.failure(f"{path} could not be written: {exc.strerror}")
        return _written(result.stdout.strip().splitlines()[-1], data, args)

    async def bash(self, command: str, cwd: str | None, timeout: float | None,
                   tool_context: InvocationContext | None) -> dict:
        try:
            seconds = check_timeout(timeout)
            where = _inside(cwd or ".", "cwd")
            request = self._request(tool_context, command=command, timeout=seconds,
                                    cwd=ROOT if where == "." else f"{ROOT}/{where}")
            result = await self._dispatch(request, tool_context)
        except _ops.Refused as exc:
            return _ops.failure(str(exc))
        except ValidationError as exc:
            return _ops.failure("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
        except (WorkerError, OrchestratorError) as exc:
            return _ops.failure(str(exc))
        return bash_answer(command, where, result.stdout, result.stderr, result.exit_code, result.timed_out, seconds)


def _written(name: str, data: bytes, args: dict[str, Any]) -> dict:
    verb = "appended to" if args.get("append") else "written to"
    return {"success": True, "message": f"SUCCESS: file {name} {verb} successfully ({len(data)} bytes)", "path": name}


def _inside(path: str, what: str) -> str:
    """``path`` normalised, lexically inside the workspace root (links are checked where the run resolves it)."""
    if "\0" in path:
        raise _ops.Refused(f"{what} {path!r} is not a path: it holds a NUL")
    _text(path, what)
    where = posixpath.normpath(path)
    if posixpath.isabs(where) or where == ".." or where.startswith("../"):
        raise _ops.Refused(f"{what} {path!r} is outside the workspace; only paths inside it may be used")
    return where


def _text(value: str, what: str) -> None:
    """``Refused`` for a string holding a lone surrogate (``orchestrator.text``)."""
    try:
        check_text(value, what)
    except UnencodableTextError as exc:
        raise _ops.Refused(str(exc)) from None


class WorkspaceFileToolSet(FileToolSet):
    """The six file tools in the session's workspace, next to a ``SkillToolSet`` (whose dispatcher, runtime and
    limits they share): ``tools=[skill_tools, WorkspaceFileToolSet(skill_tools)]``."""

    def __init__(self, skill_tools: SkillToolSet, *, skill: str | None = None, name: str = "workspace_file_tools",
                 filters_name: list[str] | None = None) -> None:
        super().__init__(backend=WorkspaceFileBackend(skill_tools, skill=skill), name=name, filters_name=filters_name)


__all__ = ["WorkspaceFileBackend", "WorkspaceFileToolSet"]
