"""Errors of the execution plane.

Every error the worker raises descends from one root::

    WorkerError
    ├── InvalidRunRequestError   a request field is unsafe or malformed (cwd, env, glob, input)
    ├── WorkspaceError           a workspace cannot be created, found or used
    ├── StagingError             a skill cannot be staged into a workspace
    │   └── DependencyError      a skill's dependency declaration is wrong, or its environment cannot be had
    │       ├── EnvironmentBuildError     resolving or installing the dependencies failed (the tool's own message)
    │       └── EnvironmentNotReadyError  the environment is not built and the run chose not to wait
    ├── RuntimeUnavailableError  a runtime cannot be used on this machine
    ├── ExecutorError            a container's executor could not be reached, or went away during a run
    │                            (``worker.runtimes.docker.executor``: ``ExecutorUnavailable``, ``ExecutorLost``)
    ├── SandboxError             a command's bubblewrap sandbox did not start
    ├── CgroupError              a run's control group could not be made or used
    ├── SpawnerError             a workspace's spawner could not start a command (the caller starts it directly)
    ├── SecretError              a team secret cannot be stored, found or decrypted (the operator key is missing or wrong)
    ├── DocumentError            a stored document (a registry's, a secret's) cannot be written or read back, or is misnamed
    ├── EgressError              an egress allow-list entry is malformed, too broad or private
    ├── EgressRefusedError       (``worker.egress.policy``) a request the egress proxy does not carry out, with its
    │   │                        HTTP status; the proxy answers it, it never leaves the proxy
    │   └── TunnelRefusedError   a tunnel ended for what its client sent first (no HTTP answer can follow)
    ├── PathRefusedError         (``worker.collect.beneath``) a path output collection does not collect or follow
    ├── AddressRefusedError      a URL's host resolves to an address the server may not connect to (or to none)
    ├── ArtifactError            an artifact cannot be stored or read
    │   └── BlobStoreError       the blob store (S3) refused a request or could not be reached
    └── SkillRootError           a skills root URL cannot be fetched (also a RuntimeError, as the guide says)
        └── UnsafeArchiveError   an archive breaks a path rule or a limit; nothing of it is kept

A command that fails, times out or writes hostile output files is *not* an error: it is reported in
the ``RunResult`` (exit code, ``timed_out``, ``skipped_files``) so nothing the command produced is lost.
"""

from __future__ import annotations


class WorkerError(Exception):
    """Root of every error raised by the ``worker`` package."""


class InvalidRunRequestError(WorkerError, ValueError):
    """A run request asks for something unsafe or malformed; nothing was executed."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class WorkspaceError(WorkerError):
    """A workspace cannot be created, found or used."""


class StagingError(WorkerError):
    """A skill cannot be staged into a workspace."""


class DependencyError(StagingError):
    """A skill's dependency declaration is wrong (which file, which line, what), or its environment cannot be had."""


class EnvironmentBuildError(DependencyError):
    """Resolving or installing a skill's dependencies failed; the message holds the resolver's or installer's own."""


class EnvironmentNotReadyError(DependencyError):
    """A skill's dependency environment is not built yet and the run asked not to wait for it."""


class RuntimeUnavailableError(WorkerError):
    """The requested runtime cannot be used here (unknown name, missing engine or extra)."""


class ArtifactError(WorkerError):
    """An artifact cannot be stored or read."""


class BlobStoreError(ArtifactError):
    """The blob store refused a request (its code and message) or could not be reached; nothing half-written of the
    artifact is listed or served."""


class SkillRootError(WorkerError, RuntimeError):
    """A skills root cannot be used: the URL fails, times out, or does not hold skills."""


class UnsafeArchiveError(SkillRootError):
    """An archive has a hostile entry (absolute path, ``..``, link, device...) or exceeds a limit."""


class ExecutorError(WorkerError):
    """The program inside a container that executes its runs (``worker.runtimes.docker.executor_inside``) could not be
    reached, or went away; the Docker runtime answers it with another way in, or fails the run saying so."""


class SandboxError(WorkerError):
    """A command's sandbox did not start (bwrap failed, or did not report its init)."""


class CgroupError(WorkerError):
    """A run's control group could not be made or used."""


class SpawnerError(WorkerError):
    """The spawner could not start a command; the caller may fall back to starting it directly."""


class SecretError(WorkerError):
    """A team secret cannot be stored, found or decrypted; the message says what to do."""


class DocumentError(WorkerError, ValueError):
    """A document of the record store cannot be written (text no store can keep) or read back (names where it lies:
    restore it from a backup), or a kind or id is not a usable name."""


class EgressError(WorkerError, ValueError):
    """An egress allow-list entry is malformed, too broad (an address range, ``*``) or private (``localhost``)."""


class AddressRefusedError(WorkerError):
    """A URL's host resolves to an address the server may not connect to (private, local, reserved), or to none
    (``worker.egress.pinned``). ``address`` is the refused one, ``None`` when the host has none."""

    def __init__(self, host: str, address: str | None, message: str) -> None:
        super().__init__(message)
        self.host = host
        self.address = address
