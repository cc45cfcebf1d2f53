"""Where a run executes: the runtime names of the run contract (a module of its own, so that the command line's
``--runtime`` choices do not load the contract's models)."""

from enum import Enum


class RuntimeName(str, Enum):
    """Where a run executes."""

    LOCAL = "local"
    DOCKER = "docker"
    CUBE = "cube"
