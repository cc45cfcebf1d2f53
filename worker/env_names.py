"""Which environment variable names a run may set (through ``env``, or as a team secret's name), and the six the
workspace sets itself (``workspace_variables``).

Light on purpose: skill parsing checks the secret names a ``SKILL.md`` declares with it, without loading the run
contract or the settings.
"""

from __future__ import annotations

import re

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_ENV_NAME_CHARS = 128
WORKSPACE_VARIABLES = ("WORKSPACE_DIR", "SKILLS_DIR", "WORK_DIR", "OUTPUT_DIR", "RUN_DIR", "SKILL_NAME")
FORBIDDEN_ENV = {"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "GCONV_PATH", "PROMPT_COMMAND", "PS4"}
FORBIDDEN_ENV_PREFIXES = ("LD_", "BASH_FUNC_", "__skillrun")
"""``__skillrun*`` names are the ready shell's own (``ready_shell.READY_SHELL_VARIABLE``)."""

ALLOWED_ENV_NAME = re.compile(
    f"^(?!{'|'.join(FORBIDDEN_ENV_PREFIXES)}|(?:{'|'.join(sorted(FORBIDDEN_ENV | set(WORKSPACE_VARIABLES)))})$)"
    + ENV_NAME.pattern.lstrip("^")
)
"""The names ``env_name_problem`` accepts, as one pattern (for schemas; it uses a look-ahead)."""


def env_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a variable a run sets, or ``None``."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return f"{str(name)[:64]!r} is not a valid environment variable name"
    if len(name) > MAX_ENV_NAME_CHARS:
        return f"{name[:32]!r}... is longer than {MAX_ENV_NAME_CHARS} characters"
    if name in FORBIDDEN_ENV or name.startswith(FORBIDDEN_ENV_PREFIXES):
        return f"{name} may not be set by a run: it changes how programs load"
    if name in WORKSPACE_VARIABLES:
        return f"{name} is set by the workspace and may not be overridden"
    return None


def workspace_variables(root: str, run_dir: str, skill_name: str) -> dict[str, str]:
    """The guide's six workspace variables of a workspace at ``root`` (as the command sees it)."""
    return {
        "WORKSPACE_DIR": root,
        "SKILLS_DIR": f"{root}/skills",
        "WORK_DIR": f"{root}/work",
        "OUTPUT_DIR": f"{root}/out",
        "RUN_DIR": run_dir,
        "SKILL_NAME": skill_name,
    }
