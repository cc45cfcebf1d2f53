"""Checks on a run request that need no workspace: done before anything is created or executed.

Every field a caller fills has a bound, so a request can neither carry a 100 MB command onto the queue nor ask
for more than the operator allows (``WorkerSettings.max_*``). The HTTP API declares the same bounds in its
schemas and calls ``validate_request`` before queueing; workers call it again before running.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

from worker import defaults
from worker.collect import expand_variables, resolve_patterns
from worker.config import WorkerSettings, get_worker_settings
from worker.contract import RunRequest
from worker.names import MAX_ENV_NAME_CHARS, env_name_problem, workspace_variables
from worker.errors import InvalidRunRequestError

_PLACEHOLDER_ROOT = "/skillrun-workspace"

MAX_COMMAND_CHARS = 128 * 1024
"""A command's length: at most 512 KiB of UTF-8, which with the environment's bound fits the kernel's 2 MiB for a
program's arguments and environment (a shell is given a command longer than one argument may be in parts:
``worker.sandbox.process.shell_argv``)."""
MAX_ENV_VARS = 64
MAX_ENV_VALUE_CHARS = 4096
"""64 such variables: at most 1 MiB of UTF-8 (4 bytes a character at most)."""
MAX_PATH_CHARS = 1024
"""A ``cwd``, an output glob, an input's destination."""
MAX_OUTPUT_PATTERNS = 64
MAX_INPUTS = 64


def _at_most(field: str, count: int, limit: int, what: str) -> None:
    if count > limit:
        raise InvalidRunRequestError(field, f"{count} {what}; the limit is {limit}")


def run_ceilings(settings: WorkerSettings) -> dict[str, float]:
    """The operator's ceilings, by field path (``limits.memory_bytes``): a request may not ask for more."""
    return {
        "timeout": settings.max_timeout_seconds,
        "limits.cpu_seconds": settings.max_cpu_seconds,
        "limits.memory_bytes": settings.max_memory_bytes,
        "limits.processes": settings.max_processes,
    }


def _validate_sizes(request: RunRequest, settings: WorkerSettings) -> None:
    """Refuse fields longer or more numerous than the bounds, and limits above the operator's ceilings."""
    _at_most("command", len(request.command), MAX_COMMAND_CHARS, "characters")
    if "\0" in request.command:
        raise InvalidRunRequestError("command", "a command cannot hold a NUL character; a shell could not be given it")
    _at_most("env", len(request.env), MAX_ENV_VARS, "variables")
    for name, value in request.env.items():
        _at_most("env", len(name), MAX_ENV_NAME_CHARS, f"characters in the name {name[:32]!r}…")
        _at_most("env", len(value), MAX_ENV_VALUE_CHARS, f"characters in the value of {name}")
    _at_most("output_files", len(request.output_files), MAX_OUTPUT_PATTERNS, "patterns")
    for pattern in request.output_files:
        _at_most("output_files", len(pattern), MAX_PATH_CHARS, "characters in a pattern")
    _at_most("cwd", len(request.cwd or ""), MAX_PATH_CHARS, "characters")
    _at_most("inputs", len(request.inputs), MAX_INPUTS, "inputs")
    for item in request.inputs:
        _at_most("inputs", len(item.name), MAX_PATH_CHARS, "characters in an input's name")
    for path, ceiling in run_ceilings(settings).items():
        value = request
        for part in path.split("."):
            value = getattr(value, part)
        if value > ceiling:
            raise InvalidRunRequestError(path, f"{value} is more than this server allows ({ceiling})")


def validate_env(env: dict[str, str]) -> None:
    """Refuse names that are not shell variables, that change how programs load, or that the workspace sets."""
    for name, value in env.items():
        problem = env_name_problem(name)
        if problem is not None:
            raise InvalidRunRequestError("env", problem)
        if not isinstance(value, str) or "\0" in value:
            raise InvalidRunRequestError("env", f"the value of {name} must be a string without NUL characters")


def placeholder_variables(skill_name: str, root: str = _PLACEHOLDER_ROOT) -> dict[str, str]:
    return workspace_variables(root, f"{root}/runs/run", skill_name)


def resolve_cwd(cwd: str, variables: dict[str, str], skill_dir: str) -> str:
    """Where ``cwd`` points, lexically; refused when it leaves the workspace."""
    root = variables["WORKSPACE_DIR"]
    expanded = expand_variables(cwd, variables, field_name="cwd")
    target = os.path.normpath(os.path.join(skill_dir, expanded))
    if target != root and not target.startswith(root + os.sep):
        raise InvalidRunRequestError("cwd", f"{cwd!r} is outside the workspace; a command may only run inside it")
    return target


INPUT_NAME_PATTERN = r"^(?!/)(?![.]+$)(?!(?:.*/)?\.\.(?:/|$))[^\\\x00]+$"
"""The names ``validate_input_name`` accepts, as one pattern (for schemas; it uses look-aheads)."""


def validate_input_name(name: str) -> PurePosixPath:
    """An input's destination relative to ``work/inputs``; refused when it could leave that folder."""
    path = PurePosixPath(name)
    if not name or "\0" in name or "\\" in name or path.is_absolute() or ".." in path.parts or name.strip(".") == "":
        raise InvalidRunRequestError("inputs", f"input destination {name!r} must be a relative path inside work/inputs")
    return path


def validate_request(
    request: RunRequest, *, allow_host_paths: bool = False, settings: WorkerSettings | None = None
) -> None:
    """Everything that can be checked before a workspace exists. Inputs read from host paths only where the caller
    allows them (the CLI, an operator), never for a model's tool call. Ceilings come from ``settings`` (default:
    this process's ``SKILLRUN_*`` environment)."""
    _validate_sizes(request, settings or get_worker_settings())
    if any(item.host_path is not None for item in request.inputs) and not allow_host_paths:
        raise InvalidRunRequestError("inputs", "host paths are not allowed for this caller; send the content instead")
    validate_env(request.env)
    variables = placeholder_variables(request.skill.name)
    resolve_patterns(request.output_files, variables, PurePosixPath(variables["WORKSPACE_DIR"]))
    if request.cwd is not None:
        resolve_cwd(request.cwd, variables, f"{variables['SKILLS_DIR']}/{request.skill.name}")
    for item in request.inputs:
        validate_input_name(item.name)
        if (item.content is None) == (item.host_path is None):
            raise InvalidRunRequestError("inputs", f"input {item.name!r} needs exactly one of content or host_path")
        if item.content is not None and len(item.content) > defaults.INPUT_FILE_BYTES:
            raise InvalidRunRequestError(
                "inputs", f"input {item.name!r} is {len(item.content)} bytes; the limit is {defaults.INPUT_FILE_BYTES}"
            )
