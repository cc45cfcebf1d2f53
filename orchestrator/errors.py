"""Errors of the control plane.

::

    OrchestratorError
    ├── SkillError
    │   ├── SkillValidationError    a SKILL.md is malformed or breaks a rule (names the file and the field)
    │   ├── SkillNotFoundError      no skill of that name in the repository
    │   └── SkillsRootNotFoundError a configured skills root does not exist
    ├── DispatchError               a run could not be handed to a runtime
    │   └── RunLostError            a run's record vanished from the run store (Redis lost its data)
├── RunNotFoundError            no run of that id for the caller's team (another team's run is not found either)
├── RunFileNotFoundError        a run has no output file or artifact of that name, or its store no longer has it
├── WorkspaceNotFoundError      no kept workspace of that id for the caller's team
├── RunRefusedError             a run that cannot be accepted as asked (its secrets), saying what to do
├── InvalidRunError             a run whose fields break a rule (names the field)
    ├── UnavailableError            a service the plane needs (Redis) cannot be reached; try again later
    ├── SessionError                a session does not exist or already exists
    ├── UnencodableTextError        a string holds a lone surrogate, which no store can keep (names the field)
    ├── ModelError                  the model endpoint failed (after retries) or answered nonsense
    ├── ToolError                   a tool is misdeclared (bad schema, duplicate name)
    ├── ToolCallRefusedError        a tool refuses one call; the model sees the message as the call's error
    ├── McpConnectionError          an MCP server cannot be started or reached, or the connection was lost
    ├── TeamError                   (orchestrator.teams) an unknown team or key, a bad team name
    ├── EgressListError             (orchestrator.egress) an egress allow-list entry that is refused
    ├── LibraryError                (orchestrator.libraries) a library that cannot be registered or changed
    ├── UsageError                  (orchestrator.cli) bad command-line input
    ├── NonFiniteNumberError        (orchestrator.api.mcp) a number in an MCP request that is not finite
    ├── ConsoleError                (orchestrator.console.auth) a console page or action refused, with its status
    └── SignInRequiredError         (orchestrator.console.auth) no live console session: to the sign-in page

Errors of the execution plane (``worker.errors``) pass through unchanged; their root is ``WorkerError``. The one
exception class outside both trees is ``Refused`` of the file tools' in-sandbox module
(``orchestrator/tools/file_tools/workspace_skill/ops.py``), which runs inside a workspace and imports nothing of
either plane.
"""

from __future__ import annotations


class OrchestratorError(Exception):
    """Root of every error raised by the ``orchestrator`` package."""


class SkillError(OrchestratorError):
    """Something is wrong with a skill or the skill repository."""


class SkillValidationError(SkillError):
    """A ``SKILL.md`` is malformed or breaks a rule."""

    def __init__(self, path: str, field: str, message: str, *, skill: str | None = None) -> None:
        self.path = path
        self.field = field
        self.message = message
        self.skill = skill
        """The name the file declares, where it was read before the rule it breaks."""
        super().__init__(f"{path}: {field}: {message}")


class SkillNotFoundError(SkillError, KeyError):
    """No usable skill of that name: none declares it, or the one that does was refused (``reason``)."""

    def __init__(self, name: str, available: list[str], reason: str | None = None) -> None:
        self.name = name
        self.available = available
        self.reason = reason
        if reason is not None:
            super().__init__(f"skill {name!r} cannot be used: {reason}")
            return
        listing = ", ".join(available) if available else "none"
        super().__init__(f"unknown skill {name!r} (available: {listing})")

    def __str__(self) -> str:
        return self.args[0]


class SkillsRootNotFoundError(SkillError):
    """A skills root that does not exist or is not a directory."""

    def __init__(self, root: str) -> None:
        self.root = root
        super().__init__(f"skills root {root!r} does not exist or is not a directory")


class DispatchError(OrchestratorError):
    """A run could not be dispatched."""


class RunLostError(DispatchError):
    """A run's record vanished from the run store while it was followed, or before it could end: lost, not unknown."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r} was lost: its record is gone from the run store (did Redis restart without "
                         f"its data?); submit it again")


class RunNotFoundError(OrchestratorError):
    """No run of that id for the caller's team: another team's run is answered as if it did not exist."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r}")


class RunFileNotFoundError(OrchestratorError):
    """A run has no output file or artifact of that name, kept none of its content, or its store lost it."""


class WorkspaceNotFoundError(OrchestratorError):
    """No kept workspace of that id for the caller's team (another team's is not found either)."""


class RunRefusedError(OrchestratorError):
    """A run that cannot be accepted as asked (a secret its skill does not declare, or its team has not stored)."""


class InvalidRunError(OrchestratorError, ValueError):
    """A run whose fields break a rule of the run contract or of this server's ceilings; the message names the field."""


class UnavailableError(OrchestratorError):
    """A service the control plane needs cannot be reached; ``retry_after`` seconds is a fair pause before trying again."""

    def __init__(self, message: str, retry_after: int) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class SessionError(OrchestratorError):
    """A session does not exist, or already exists."""


class UnencodableTextError(OrchestratorError, ValueError):
    """A string holds a lone surrogate (a code point U+D800-U+DFFF, which a JSON ``\\ud800`` escape or bytes that are
    not UTF-8 decoded with ``surrogateescape`` make): it is not Unicode text, and UTF-8 (every store's encoding)
    cannot encode it. ``where`` names the field (``state.notes.0``); the message never repeats the text."""

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        super().__init__(message)


class ModelError(OrchestratorError):
    """The model endpoint failed after retries, or sent something that cannot be used."""


class ToolError(OrchestratorError):
    """A tool is declared wrongly (a type with no JSON schema, a duplicate registered name)."""


class ToolCallRefusedError(OrchestratorError):
    """A tool call the tool will not carry out; ``str()`` is the error the model sees in the call's result."""


class McpConnectionError(OrchestratorError):
    """An MCP server could not be started or reached, did not answer the handshake in time, or the connection to it
    was lost during a request (the next request connects again)."""
