"""The names of the run contract: where a run executes (``RuntimeName``); which environment variable names a run
may set (through ``env``, or as a team secret's name), and the six the workspace sets itself
(``workspace_variables``); and the hosts a run may reach, its egress allow-list entries (``parse_entries``).

Light on purpose, importing nothing of the worker but its errors: the command line's ``--runtime`` choices and skill
parsing (the secret and egress names a ``SKILL.md`` declares) use it without loading the run contract's models or
the settings.

Egress entries: what a run's allow-list holds and what makes an entry acceptable (the list a run gets is
``worker.egress.policy.effective``).

An entry is ``host`` or ``*.domain``, with an optional ``:port`` (443 unless given): ``api.github.com``,
``*.example.com:8443``. A team's list is set by the operator (``orchestrator.egress``); a skill declares the hosts
its commands need in its front matter (``metadata.egress``, the same syntax); a run of the skill reaches the hosts
that are on both (``effective``): a skill entry its team's list covers, or a team entry the skill's list covers. A
skill that declares none gets none, whatever its team allows.

Refused, with the reason (``EgressError``): an address or an address range (``10.0.0.0/8``, ``[::1]``): a run names
hosts, and the proxy checks what they resolve to; a wildcard for everything (``*``, ``*.*``) or a whole top-level
domain (``*.com``) or any other public suffix (``*.co.uk``, ``*.github.io``, ``*.s3.amazonaws.com``: a
domain under which anyone may register a name, after the Public Suffix List, ``publicsuffixlist``'s copy); a name
that is not public (``localhost``, one label alone, ``*.local``, ``*.internal``,
``*.home.arpa``...: what a private resolver answers, never the internet); a top-level label that is a number (a
resolver would take ``127.1`` for an address); a port that is not 1-65535.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from publicsuffixlist import PublicSuffixList

from worker.errors import EgressError


class RuntimeName(str, Enum):
    """Where a run executes."""

    LOCAL = "local"
    DOCKER = "docker"
    CUBE = "cube"


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


def is_address(text: str) -> bool:
    """Whether ``text`` is an IP address (v4 or v6) rather than a name."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


DEFAULT_PORT = 443
MAX_ENTRIES = 64
"""The most entries a team's list (or a skill's declaration) may have."""
PRIVATE_SUFFIXES = ("localhost", "local", "internal", "intranet", "lan", "home", "corp", "private", "arpa",
                    "home.arpa", "localdomain", "test", "invalid", "example")
"""Top-level names (and ``home.arpa``) that a private resolver answers, or none (RFC 2606, 6761, 6762, 8375)."""
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_TOP_LABEL = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")


@dataclass(frozen=True, order=True)
class Entry:
    """One allowed destination: a host name, or every name under ``host`` when ``wildcard``; and a port."""

    host: str
    port: int
    wildcard: bool = False

    def __str__(self) -> str:
        return f"{'*.' if self.wildcard else ''}{self.host}:{self.port}"

    def covers(self, other: Entry) -> bool:
        """Whether every destination ``other`` allows, this one allows too."""
        if self.port != other.port:
            return False
        if not self.wildcard:
            return not other.wildcard and self.host == other.host
        return other.host.endswith("." + self.host)


def parse_entry(text: str) -> Entry:
    """``text`` as an entry (see the module's description), or ``EgressError`` saying what is wrong with it."""
    if not isinstance(text, str):
        raise EgressError(f"egress entry {text!r}: must be text such as api.example.com or *.example.com:8443")
    raw = text.strip().lower().rstrip(".")
    shown = repr(text)
    if not raw:
        raise EgressError("egress entry '': name a host such as api.example.com")
    if "/" in raw:
        raise EgressError(f"egress entry {shown} is an address range: name the hosts a run may reach instead")
    host, port = _split_port(raw, shown)
    if is_address(host):
        raise EgressError(f"egress entry {shown} is an IP address: name the host instead (the proxy checks what a "
                          "name resolves to; a raw address is never allowed)")
    wildcard = host.startswith("*.") or host == "*"
    name = host[2:] if host.startswith("*.") else host
    if host == "*" or "*" in name:
        raise EgressError(f"egress entry {shown} is a wildcard for everything: only one leading '*.' is allowed, "
                          "under a registered domain (*.example.com)")
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise EgressError(f"egress entry {shown} is not a host name (letters, digits and hyphens in dot-separated "
                          "labels)")
    if not _TOP_LABEL.fullmatch(labels[-1]):
        raise EgressError(f"egress entry {shown} ends in a number, which a resolver may take for an address")
    if any(name == suffix or name.endswith("." + suffix) for suffix in PRIVATE_SUFFIXES) or len(labels) == 1:
        if wildcard and len(labels) == 1 and name not in PRIVATE_SUFFIXES:
            raise EgressError(f"egress entry {shown} allows a whole top-level domain: name a domain under it "
                              f"(*.example.{name})")
        raise EgressError(f"egress entry {shown} is a private or local name, which a run may never reach")
    if wildcard and public_suffixes().is_public(name):
        raise EgressError(f"egress entry {shown} allows every site under the public suffix {name!r}, where anyone may "
                          f"register a name: name the domain that is yours under it (*.example.{name})")
    return Entry(name, port, wildcard)


@functools.cache
def public_suffixes() -> PublicSuffixList:
    """The Public Suffix List, ICANN's and the private section's (``github.io``), as ``publicsuffixlist`` ships it
    (read once per process, on the first wildcard entry: tens of milliseconds)."""
    return PublicSuffixList()


def _split_port(raw: str, shown: str) -> tuple[str, int]:
    if raw.startswith("[") or raw.count(":") > 1:
        raise EgressError(f"egress entry {shown} is an IP address: name the host instead")
    host, colon, port = raw.partition(":")
    if not colon:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise EgressError(f"egress entry {shown} has a bad port {port!r}: use 1-65535 (443 when none is given)")
    return host, int(port)


def parse_entries(texts: Iterable[str], what: str = "an egress allow-list") -> list[Entry]:
    """Every entry of ``texts``, sorted, once each; ``EgressError`` for the first bad one, or too many."""
    entries = sorted({parse_entry(text) for text in texts}, key=str)
    if len(entries) > MAX_ENTRIES:
        raise EgressError(f"{what} has {len(entries)} entries; it may have at most {MAX_ENTRIES}")
    return entries
